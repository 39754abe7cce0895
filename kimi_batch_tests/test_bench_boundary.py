"""The bench (`kimi_batch_bench/`) sits beside the runtime: the runtime never imports it, and the
`kimi-batch` command finds it by name in one place, or says which extra to install."""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

import pytest

from kimi_batch.cli import main
from kimi_batch.cli.bench_hook import BENCH_COMMANDS, BENCH_PACKAGE
from kimi_batch.cli.commands import build_parser

PACKAGE = Path(__file__).resolve().parent.parent / "kimi_batch"
# The one runtime module that names the bench: the CLI's hook, which loads it when it is there.
HOOK = PACKAGE / "cli" / "bench_hook.py"


def _imported(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


def test_no_runtime_module_imports_the_bench() -> None:
    importing = [
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*.py")
        if any(module.split(".")[0] == BENCH_PACKAGE for module in _imported(path))
    ]
    assert importing == []


def test_only_the_cli_hook_names_the_bench() -> None:
    """A name in a string (`importlib.import_module`) is an import too: one place may hold it."""
    naming = [path for path in PACKAGE.rglob("*.py") if BENCH_PACKAGE in path.read_text("utf-8")]
    assert naming == [HOOK]


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_the_command_adds_the_bench_commands_from_the_bench() -> None:
    commands = _subcommands(build_parser())
    for name in BENCH_COMMANDS:
        assert commands[name].get_default("func").__module__ == f"{BENCH_PACKAGE}.commands"


@pytest.mark.parametrize(
    "argv", [["bench", "--workload", "night"], ["plan", "--rows", "3", "-h"], ["tune"]]
)
def test_without_the_bench_its_commands_name_the_extra_to_install(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, BENCH_PACKAGE, None)  # import fails as if not installed

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"kimi-batch: error: 'kimi-batch {argv[0]}' is part of the bench: install the bench "
        "extra (pip install 'kimi_batch[bench]')"
    ]
    assert "bench" not in build_parser().format_help()  # and the command list leaves them out
