"""`kimi-batch warehouse migrate|maintain` on the embedded default's state dir."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from kimi_batch.cli import main
from kimi_batch.settings import Settings
from kimi_batch.warehouse import open_warehouse, polars_schema
from kimi_batch_tests.support.rows import amplified


def test_migrate_then_maintain_from_the_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path))
    folder = tmp_path / "warehouse" / "amplified" / "ds=2024-05-01" / "source=demo"
    folder.mkdir(parents=True)
    rows = [row.model_dump() for row in amplified(3)]
    pl.DataFrame(rows, schema=polars_schema("amplified")).write_parquet(folder / "part-0.parquet")

    assert main(["warehouse", "migrate"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["partitions"], report["rows"]) == ({"copied": 1}, 3)
    assert open_warehouse(Settings.from_env()).count("amplified") == 3

    assert main(["warehouse", "migrate"]) == 0  # a rerun copies nothing again
    assert json.loads(capsys.readouterr().out)["partitions"] == {"present": 1}

    assert main(["warehouse", "maintain"]) == 0
    (table,) = json.loads(capsys.readouterr().out)["tables"]
    assert (table["table"], table["snapshots_expired"]) == ("amplified", 0)


def test_migrate_from_a_missing_folder_is_one_clear_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path))
    assert main(["warehouse", "migrate", "--from", str(tmp_path / "nowhere")]) == 2
    assert "no such warehouse folder" in capsys.readouterr().err
