"""docs/reference/ is what the code says: regenerated in memory, every committed page must match."""

from __future__ import annotations

import html
import os
import re
from collections.abc import Iterator
from pathlib import Path

import markdown
import pytest

from kimi_batch.cli.reference import (
    PAGES,
    REFERENCE_DIR,
    main,
    render_pages,
    setting_rows,
    stale_pages,
)
from kimi_batch.settings import ConfigError, Settings, variable_of


def test_every_committed_reference_page_is_current() -> None:
    stale = stale_pages(REFERENCE_DIR)
    assert not stale, f"docs/reference/ is stale: {', '.join(stale)}; run `make reference`"


def test_a_default_changed_in_settings_without_regenerating_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(Settings.model_fields["llama_threads"], "default", 99)

    assert "environment.md" in stale_pages(REFERENCE_DIR)
    assert "| `KIMI_BATCH_LLAMA_THREADS` | `99` |" in render_pages()["environment.md"]


def test_check_writes_nothing_and_names_the_stale_pages(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--check", "--out", str(tmp_path)]) == 1
    assert not list(tmp_path.iterdir())
    assert "environment.md" in capsys.readouterr().err

    assert main(["--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(PAGES)
    assert main(["--check", "--out", str(tmp_path)]) == 0


def test_every_setting_has_a_meaning() -> None:
    missing = [variable for _, variable, _, meaning in setting_rows() if not meaning]
    assert not missing, f"Settings fields without a description: {missing}"


def test_every_variable_on_the_page_is_the_one_from_env_reads(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Each variable the page names, set alone to "x", changes its field or is refused in one
    # line naming it: the page names no variable that from_env ignores.
    for variable in [v for v in os.environ if v.startswith("KIMI_BATCH_")]:
        monkeypatch.delenv(variable)
    monkeypatch.chdir(tmp_path)
    unset = Settings.from_env()
    for name in Settings.model_fields:
        variable = variable_of(name)
        with monkeypatch.context() as scope:
            scope.setenv(variable, "x")
            try:
                read: object = getattr(Settings.from_env(), name)
            except ConfigError as error:
                read = error
        if isinstance(read, ConfigError):
            assert variable in str(read), (name, str(read))
        else:
            assert read != getattr(unset, name), f"{name}: from_env never reads {variable}"


def test_the_defaults_on_the_page_are_what_an_empty_environment_gives(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for variable in [v for v in os.environ if v.startswith("KIMI_BATCH_")]:
        monkeypatch.delenv(variable)
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path))
    settings = Settings.from_env()
    for name, field in Settings.model_fields.items():
        shown = isinstance(field.json_schema_extra, dict) and field.json_schema_extra
        if shown or field.is_required():
            continue  # computed from the environment: its page text says how
        assert getattr(settings, name) == field.default, name


def test_the_pages_name_every_variable_command_table_and_route() -> None:
    pages = render_pages()
    assert "`KIMI_BATCH_NIGHT_ENDS`" in pages["environment.md"]
    assert "## `kimi-batch digest lint`" in pages["cli.md"]
    assert "| `--prompt-tokens` |" in pages["cli.md"]
    assert "## `distilled`" in pages["tables.md"]
    assert "| `input_sha256` | `VARCHAR` |" in pages["tables.md"]
    assert "### `POST /v1/batches/{batch_id}/cancel`" in pages["batch-api.md"]


# GitHub's tables split a row at every `|` not escaped by a backslash, in code spans too.
_GITHUB_CELL_BREAK = re.compile(r"(?<!\\)\|")


def _tables(page: str) -> Iterator[list[str]]:
    """Each Markdown table of `page`, as its lines."""
    table: list[str] = []
    for line in [*page.splitlines(), ""]:
        if line.startswith("|"):
            table.append(line)
        elif table:
            yield table
            table = []


def test_every_table_row_has_its_header_cells_on_github() -> None:
    for name, page in render_pages().items():
        for table in _tables(page):
            counts = {len(_GITHUB_CELL_BREAK.split(row.strip().strip("|"))) for row in table}
            assert len(counts) == 1, f"{name}: {table}"


def test_mkdocs_shows_an_option_and_a_help_text_as_the_parser_writes_them() -> None:
    page = markdown.markdown(render_pages()["cli.md"], extensions=["tables"])
    codes = [html.unescape(text) for text in re.findall(r"<code>(.*?)</code>", page)]
    assert "--system keep|drop|once|FILE" in codes
    assert "--as-of SNAPSHOT|TAG|DATE" in codes
    assert not [text for text in codes if "\\|" in text]
    # A help text's `<think>` is text, not a tag the page would hide.
    assert "inside &lt;think&gt; tags" in page
