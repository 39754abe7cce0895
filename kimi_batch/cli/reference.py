"""The reference pages of the documentation, generated from the code so they cannot drift.

`python -m kimi_batch.cli.reference` (`make reference`) writes `docs/reference/*.md`: the
environment variables from `Settings`, the `kimi-batch` command from its parser, the tables from
the row models, the Batch API from its OpenAPI schema. `--check` writes nothing and exits 1
naming the pages that differ from what the code says (a test does the same in memory).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator, Sequence
from datetime import date, time
from pathlib import Path
from typing import Any

from pydantic_core import PydanticUndefined

from kimi_batch.cli.reference_schemas import GENERATED, batch_api_page, cell, code, tables_page
from kimi_batch.settings import Settings, variable_of

REFERENCE_DIR = Path(__file__).resolve().parents[2] / "docs" / "reference"
# The reference page's sections: the first prefix a field name starts with (or equals) wins.
_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("State", ("home", "warehouse", "s3_", "database_url")),
    ("The model server", ("model", "llama_", "slot_saves_max")),
    ("Prompts and outputs", ("digest", "output_model_modules")),
    ("Inputs and partitions", ("inbox_", "max_input_mb", "partitions_start")),
    ("The night", ("timezone", "nightly_", "night_")),
    ("Trino", ("trino_",)),
    ("Alerts", ("alert_", "dagster_url")),
    ("Batch API", ("api_",)),
)
# Each usage line wraps at one width, whatever the terminal the page is generated from.
_USAGE_WIDTH = 100


def _group(field: str) -> str:
    for title, prefixes in _GROUPS:
        if any(field == prefix or field.startswith(prefix) for prefix in prefixes):
            return title
    return "Other"


def _shown(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, tuple):
        return " ".join(f"`{item}`" for item in value) if value else "empty"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, date | time):
        value = value.isoformat()
    # A backtick span: `cell` writes one holding a `|` as `code` does.
    return f"`{value}`"


def setting_rows() -> Iterator[tuple[str, str, str, str]]:
    """(group, variable, default, meaning) of every `Settings` field, in declaration order."""
    for name, field in Settings.model_fields.items():
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        shown = extra.get("shown_default")
        if isinstance(shown, str):
            default = shown
        elif field.default is PydanticUndefined:
            default = "required"
        else:
            default = _shown(field.default)
        yield _group(name), variable_of(name), default, field.description or ""


def environment_page() -> str:
    lines = [
        "# Environment variables",
        "",
        GENERATED,
        "",
        "Every variable is read once per process (the code location when Dagster loads it, each",
        "`kimi-batch` command when it starts) into one `Settings`; a changed variable takes",
        "effect when the code location is reloaded. A value that cannot be used ends the command",
        "with one line naming the variable (exit 2). Variables that only the build reads:",
        "`KIMI_BATCH_LLAMA_AMX` ([Troubleshooting](../operations/troubleshooting.md)).",
    ]
    groups: dict[str, list[tuple[str, str, str]]] = {}
    for group, variable, default, meaning in setting_rows():
        groups.setdefault(group, []).append((variable, default, meaning))
    for title, rows in groups.items():
        lines += ["", f"## {title}", "", "| Variable | Default | Meaning |", "| --- | --- | --- |"]
        lines += [
            f"| `{var}` | {cell(default)} | {cell(meaning)} |" for var, default, meaning in rows
        ]
    return "\n".join(lines) + "\n"


def _fixed_width(prog: str) -> argparse.HelpFormatter:
    return argparse.HelpFormatter(prog, width=_USAGE_WIDTH)


def _commands(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """The parser and every subcommand's, depth first, in the order `--help` lists them."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _commands(sub)


def _is_group(parser: argparse.ArgumentParser) -> bool:
    return any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)


def _option_rows(parser: argparse.ArgumentParser) -> list[str]:
    rows: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        name = ", ".join(action.option_strings) or action.dest
        if action.metavar is not None and action.option_strings:
            name += f" {action.metavar}"
        meaning = action.help or ""
        if action.choices is not None:
            listed = ", ".join(f"`{choice}`" for choice in action.choices)
            meaning = f"{meaning}; one of {listed}" if meaning else f"One of {listed}"
        if action.required and action.option_strings:
            meaning = f"Required. {meaning}".strip()
        default = action.default
        shown = "" if default in (None, False, [], argparse.SUPPRESS) else _shown(default)
        if isinstance(default, list):
            shown = " ".join(f"`{item}`" for item in default)
        rows.append(f"| {code(name)} | {cell(shown)} | {cell(meaning)} |")
    return rows


def cli_page() -> str:
    from kimi_batch.cli.commands import build_parser

    lines = ["# The kimi-batch command", "", GENERATED]
    for parser in _commands(build_parser()):
        parser.formatter_class = _fixed_width
        lines += ["", f"## `{parser.prog}`", ""]
        if parser.description:
            lines += [parser.description.strip(), ""]
        lines += ["```text", parser.format_usage().strip(), "```"]
        if _is_group(parser):
            subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
            lines += ["", "| Command | What it does |", "| --- | --- |"]
            lines += [
                f"| `{parser.prog} {choice.dest}` | {cell(choice.help or '')} |"
                for choice in subs._choices_actions
            ]
        rows = _option_rows(parser)
        if rows:
            lines += ["", "| Option | Default | What it does |", "| --- | --- | --- |", *rows]
    return "\n".join(lines) + "\n"


PAGES: dict[str, Callable[[], str]] = {
    "environment.md": environment_page,
    "cli.md": cli_page,
    "tables.md": tables_page,
    "batch-api.md": batch_api_page,
}
"""Page file name (under docs/reference/) -> its generator."""


def render_pages() -> dict[str, str]:
    return {name: render() for name, render in PAGES.items()}


def stale_pages(root: Path = REFERENCE_DIR) -> list[str]:
    """The pages whose file under `root` differs from what the code says (or is missing)."""
    stale: list[str] = []
    for name, text in render_pages().items():
        path = root / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            stale.append(name)
    return stale


def write_pages(root: Path = REFERENCE_DIR) -> list[Path]:
    root.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for name, text in render_pages().items():
        path = root / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kimi_batch.cli.reference",
        description="Write the documentation's reference pages from the code.",
    )
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when stale")
    parser.add_argument("--out", type=Path, default=REFERENCE_DIR, help="the pages' folder")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_pages(args.out)
        for name in stale:
            print(f"stale: {args.out / name} (run `make reference`)", file=sys.stderr)
        return 1 if stale else 0
    for path in write_pages(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
