"""`kimi-batch export --as-of`: an earlier night's export again, byte for byte, after a later
write replaced some of its partitions (by snapshot id, by night tag, by date-time)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from kimi_batch.cli.commands import main
from kimi_batch.cli.export import ExportRequest, run_export
from kimi_batch.errors import ConfigError
from kimi_batch.pipeline import DistilledRow, QuarantineRow
from kimi_batch.settings import Settings
from kimi_batch.warehouse import Warehouse, night_tag, tag_night
from kimi_batch_tests.support.exports import DAYS, build_warehouse


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return Settings.from_env()


def _export(settings: Settings, fmt: str, out: Path, as_of: str | None = None) -> Path:
    return run_export(settings, ExportRequest(fmt=fmt, out=out, as_of=as_of))


def _files(path: Path) -> dict[str, bytes]:
    if path.is_file():
        return {"": path.read_bytes()}
    return {
        str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()
    }


def _replace_later_night(warehouse: Warehouse) -> None:
    """The next night: one partition's answers replaced, another's quarantine emptied."""
    first = warehouse.read_rows("distilled", DAYS[0], "alpha", DistilledRow)
    warehouse.write_partition("distilled", DAYS[0], "alpha", first[:1])
    warehouse.write_partition("quarantine", DAYS[1], "beta", list[QuarantineRow]())


@pytest.mark.parametrize("fmt", ["openai-batch", "chat", "hf"])
def test_as_of_reproduces_an_earlier_night_byte_for_byte(
    settings: Settings, tmp_path: Path, fmt: str
) -> None:
    warehouse = build_warehouse(settings)
    tagged = tag_night(warehouse, DAYS[1])
    distilled_then = warehouse.snapshot_id("distilled")
    assert tagged["distilled"] == distilled_then
    before = _files(_export(settings, fmt, tmp_path / "before"))
    time.sleep(0.05)
    between = datetime.now(UTC).replace(tzinfo=None).isoformat()  # naive: read as UTC
    time.sleep(0.05)
    _replace_later_night(warehouse)
    now = _files(_export(settings, fmt, tmp_path / "now"))
    assert now != before  # the later night changed what a current export holds

    for name, as_of in (
        ("id", str(distilled_then)),
        ("tag", night_tag(DAYS[1])),
        ("time", between),
    ):
        again = _files(_export(settings, fmt, tmp_path / f"again-{name}", as_of))
        assert again == before, f"--as-of {as_of} ({name})"
    # The day's end (UTC) is after the later night: today's state.
    today = datetime.now(UTC).date().isoformat()
    assert _files(_export(settings, fmt, tmp_path / "today", today)) == now


def test_the_hf_card_names_the_snapshot_of_each_table(settings: Settings, tmp_path: Path) -> None:
    warehouse = build_warehouse(settings)
    tagged = tag_night(warehouse, DAYS[1])
    _replace_later_night(warehouse)
    then = (
        _export(settings, "hf", tmp_path / "then", night_tag(DAYS[1])) / "README.md"
    ).read_text()
    now = (_export(settings, "hf", tmp_path / "now") / "README.md").read_text()
    assert set(tagged) == {"amplified", "distilled", "quarantine", "seeds"}
    for table, snapshot in tagged.items():
        assert f"| {table} | {snapshot} |" in then
        assert f"| {table} | {warehouse.snapshot_id(table)} |" in now
    # The later night's commits are in the current card only.
    for table in ("distilled", "quarantine"):
        assert warehouse.snapshot_id(table) != tagged[table]
        assert f"| {table} | {tagged[table]} |" not in now


def test_an_unknown_as_of_is_one_line_and_exit_2(
    settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    build_warehouse(settings)
    yesterday = (datetime.now(UTC) - timedelta(days=1)).date().isoformat()
    for as_of, says in (
        ("123456789", "no table has snapshot 123456789"),
        ("night-1999-01-01", "no table has tag 'night-1999-01-01'"),
        (yesterday, "the distilled table had no snapshot at"),
    ):
        assert main(["export", "--as-of", as_of]) == 2
        err = capsys.readouterr().err.strip()
        assert says in err
        assert len(err.splitlines()) == 1, err
    with pytest.raises(ConfigError, match="its first snapshot is of"):
        _export(settings, "chat", Path("unused"), yesterday)
