"""Snapshots by name: the night tag (moved by a re-run night, in one commit), an as-of resolved
to one snapshot a table, the newest snapshot of each table."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from kimi_batch.errors import ConfigError
from kimi_batch.pipeline import DistilledRow
from kimi_batch.warehouse import (
    Warehouse,
    newest_snapshots,
    night_tag,
    open_catalog,
    resolve_as_of,
    tag_night,
)
from kimi_batch.warehouse.maintenance import maintain
from kimi_batch_tests.support.repo import REPO_ROOT
from kimi_batch_tests.support.rows import amplified, distilled

DS = "2024-05-01"


def _answers(n: int) -> list[DistilledRow]:
    return distilled(amplified(n))


def _commits(warehouse: Warehouse, table: str) -> int:
    """Metadata files the table went through: one a commit."""
    iceberg = open_catalog(warehouse.spec).load_table(warehouse.identifier(table))
    return len(iceberg.metadata.metadata_log) + 1


def test_a_night_tags_each_table_and_a_rerun_moves_the_tag_in_one_commit(tmp_path: Path) -> None:
    warehouse = Warehouse(tmp_path / "warehouse")
    first = warehouse.write_partition("distilled", DS, "a", _answers(2)).snapshot_id
    seeds_like = warehouse.write_partition("amplified", DS, "a", amplified(1)).snapshot_id
    assert tag_night(warehouse, "2024-05-01") == {"distilled": first, "amplified": seeds_like}
    assert tag_night(warehouse, "2024-05-01") == {"distilled": first, "amplified": seeds_like}

    rerun = warehouse.write_partition("distilled", DS, "a", _answers(1)).snapshot_id
    before = _commits(warehouse, "distilled")
    assert tag_night(warehouse, "2024-05-01")["distilled"] == rerun
    assert _commits(warehouse, "distilled") == before + 1  # removed and created in one commit
    shown = {s.table: s for s in newest_snapshots(warehouse)}
    assert shown["distilled"].snapshot_id == rerun
    assert shown["distilled"].night_tag == night_tag("2024-05-01") == "night-2024-05-01"
    assert shown["distilled"].night_snapshot_id == rerun
    assert resolve_as_of(warehouse, "night-2024-05-01", required="distilled") == {
        "distilled": rerun,
        "amplified": seeds_like,
    }


def test_newest_snapshots_name_the_newest_night_and_the_commit_time(tmp_path: Path) -> None:
    warehouse = Warehouse(tmp_path / "warehouse")
    assert newest_snapshots(warehouse) == []  # no catalog yet: nothing created by the read
    assert not (tmp_path / "ledger").exists()
    start = datetime.now(UTC) - timedelta(seconds=1)
    warehouse.write_partition("distilled", DS, "a", _answers(1))
    tag_night(warehouse, "2024-05-01")
    newest = warehouse.write_partition("distilled", DS, "b", _answers(1)).snapshot_id
    tag_night(warehouse, "2024-05-02")
    warehouse.write_partition("distilled", DS, "c", _answers(1))
    (shown,) = newest_snapshots(warehouse)
    assert shown.table == "distilled"
    assert shown.snapshot_id == warehouse.snapshot_id("distilled")
    assert start <= shown.committed_at <= datetime.now(UTC)
    assert (shown.night_tag, shown.night_snapshot_id) == ("night-2024-05-02", newest)


def test_a_snapshot_id_fixes_the_other_tables_at_its_commit(tmp_path: Path) -> None:
    warehouse = Warehouse(tmp_path / "warehouse")
    old_variants = warehouse.write_partition("amplified", DS, "a", amplified(1)).snapshot_id
    answers = warehouse.write_partition("distilled", DS, "a", _answers(2)).snapshot_id
    time.sleep(0.01)
    warehouse.write_partition("amplified", DS, "a", amplified(3))
    assert resolve_as_of(warehouse, str(answers), required="distilled") == {
        "amplified": old_variants,
        "distilled": answers,
    }
    pinned = warehouse.pinned(resolve_as_of(warehouse, str(answers), required="distilled"))
    assert pinned.read_partition("amplified", DS, "a").height == 1
    assert warehouse.read_partition("amplified", DS, "a").height == 3


@pytest.mark.parametrize(
    ("as_of", "says"),
    [
        ("42", "no table has snapshot 42"),
        ("night-2000-01-01", "no table has tag 'night-2000-01-01'"),
        ("2000-01-01", "the distilled table had no snapshot at 2000-01-01T23:59:59.999000+00:00"),
        ("2000-01-01T06:00:00+02:00", "had no snapshot at 2000-01-01T06:00:00+02:00"),
    ],
)
def test_an_as_of_that_names_nothing_is_refused(tmp_path: Path, as_of: str, says: str) -> None:
    warehouse = Warehouse(tmp_path / "warehouse")
    warehouse.write_partition("distilled", DS, "a", _answers(1))
    with pytest.raises(ConfigError, match=says.replace("+", r"\+").replace(".", r"\.")):
        resolve_as_of(warehouse, as_of, required="distilled")


def test_the_last_day_of_the_calendar_reads_the_current_snapshot(tmp_path: Path) -> None:
    """Its end was the next day's midnight less a millisecond, and 9999-12-31 has no next day
    (an OverflowError traceback)."""
    warehouse = Warehouse(tmp_path / "warehouse")
    current = warehouse.write_partition("distilled", DS, "a", _answers(1)).snapshot_id
    assert resolve_as_of(warehouse, "9999-12-31", required="distilled") == {"distilled": current}


def test_a_time_before_a_table_existed_reads_it_as_empty(tmp_path: Path) -> None:
    warehouse = Warehouse(tmp_path / "warehouse")
    answers = warehouse.write_partition("distilled", DS, "a", _answers(1)).snapshot_id
    time.sleep(0.01)
    between = datetime.now(UTC).isoformat()
    time.sleep(0.01)
    warehouse.write_partition("amplified", DS, "a", amplified(1))
    assert resolve_as_of(warehouse, between, required="distilled") == {"distilled": answers}
    with pytest.raises(ConfigError, match="the amplified table had no snapshot"):
        resolve_as_of(warehouse, between, required="amplified")


def test_the_how_to_s_python_reads_a_night_s_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/how-to/snapshots.md's code as written, on a state dir with a tagged night."""
    page = (REPO_ROOT / "docs" / "how-to" / "snapshots.md").read_text(encoding="utf-8")
    (code,) = re.findall(r"```python\n(.*?)```", page, flags=re.DOTALL)
    home = tmp_path / "home"
    warehouse = Warehouse(home / "warehouse")
    night = warehouse.write_partition("distilled", DS, "a", _answers(3)).snapshot_id
    tag_night(warehouse, "2026-12-04")
    warehouse.write_partition("distilled", DS, "a", _answers(1))
    monkeypatch.setenv("KIMI_BATCH_HOME", str(home))

    exec(compile(code, "snapshots.md", "exec"), {})  # the page's own code, as a reader runs it

    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"3 3 {night}"
    assert "night-2026-12-04" in lines[-1]


def _moment() -> str:
    """A moment strictly between the commit before and the commit after."""
    time.sleep(0.01)
    moment = datetime.now(UTC).isoformat()
    time.sleep(0.01)
    return moment


def test_a_moment_whose_snapshot_was_expired_is_refused_not_read_older(tmp_path: Path) -> None:
    warehouse = Warehouse(tmp_path / "warehouse")
    tagged = warehouse.write_partition("distilled", DS, "a", _answers(1)).snapshot_id
    tag_night(warehouse, DS)
    second = warehouse.write_partition("distilled", DS, "b", _answers(1)).snapshot_id
    between = _moment()
    newest = warehouse.write_partition("distilled", DS, "c", _answers(1)).snapshot_id
    after = _moment()
    assert resolve_as_of(warehouse, between, required="distilled") == {"distilled": second}

    maintain(warehouse, retention=timedelta(0))  # the second snapshot expires: not tagged

    # Not the tagged snapshot before it (1 row instead of 2): the moment can't be read exactly.
    with pytest.raises(ConfigError, match="expired by maintenance") as refused:
        resolve_as_of(warehouse, between, required="distilled")
    says = str(refused.value)
    assert "\n" not in says
    assert "KIMI_BATCH_SNAPSHOT_RETENTION_DAYS" in says
    assert "night-2024-05-01" in says
    committed = warehouse.iceberg_table("distilled")
    assert committed is not None
    newest_snapshot = committed.snapshot_by_id(newest)
    assert newest_snapshot is not None
    newest_at = datetime.fromtimestamp(newest_snapshot.timestamp_ms / 1000, UTC)
    assert newest_at.isoformat() in says
    # What is still exact reads as before: the tag, the newest snapshot, a moment after it.
    assert resolve_as_of(warehouse, night_tag(DS), required="distilled") == {"distilled": tagged}
    assert resolve_as_of(warehouse, after, required="distilled") == {"distilled": newest}
    assert resolve_as_of(warehouse, str(newest), required="distilled") == {"distilled": newest}
    with pytest.raises(ConfigError, match=f"no table has snapshot {second}"):
        resolve_as_of(warehouse, str(second), required="distilled")


def test_a_table_whose_older_snapshots_expired_is_not_read_as_empty(tmp_path: Path) -> None:
    warehouse = Warehouse(tmp_path / "warehouse")
    answers = warehouse.write_partition("distilled", DS, "a", _answers(1)).snapshot_id
    tag_night(warehouse, DS)  # amplified has no snapshot yet: not tagged
    warehouse.write_partition("amplified", DS, "a", amplified(1))
    between = _moment()
    warehouse.write_partition("amplified", DS, "a", amplified(2))
    assert set(resolve_as_of(warehouse, between, required="distilled")) == {
        "distilled",
        "amplified",
    }

    maintain(warehouse, retention=timedelta(0))  # amplified keeps only its current snapshot

    with pytest.raises(ConfigError, match=r"the amplified table's history at .* was expired"):
        resolve_as_of(warehouse, between, required="distilled")
    # Its state when distilled's snapshot was committed is gone too: refused, not empty.
    with pytest.raises(ConfigError, match="the amplified table's history"):
        resolve_as_of(warehouse, str(answers), required="distilled")
    # The night's tag still reads it as it was then, before its first commit: empty.
    assert resolve_as_of(warehouse, night_tag(DS), required="distilled") == {"distilled": answers}
