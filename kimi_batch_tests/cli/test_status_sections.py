"""`kimi-batch status` on broken or absent state, through the CLI's `main` (no server needed: it
reports none); the one-line refusal runs as a child process, where a warning printed at import
would show.

Status is read-only and reports what it cannot read in that section; the partition states come
from Dagster's own per-partition status, however many runs came after a failure.
"""

import json
import os
import shutil
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from dagster._core.events import AssetMaterializationPlannedData, DagsterEvent, DagsterEventType
from dagster._core.events.log import EventLogEntry

from kimi_batch.cli.commands import main
from kimi_batch.defs.partition_states import PartitionState, distill_states
from kimi_batch.defs.partitions import DATE_DIMENSION, SOURCE_DIMENSION, build_batch_partitions
from kimi_batch.settings import Settings
from kimi_batch.warehouse import Warehouse, tag_night
from kimi_batch_tests.support.ports import free_port
from kimi_batch_tests.support.repo import REPO_ROOT
from kimi_batch_tests.support.rows import amplified, distilled

pytestmark = pytest.mark.filterwarnings("ignore:Non-compliant tag keys:DeprecationWarning")

DAY = (datetime.now(UTC).date() - timedelta(days=1)).isoformat()


def _status(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KIMI_BATCH_")}
    env["KIMI_BATCH_HOME"] = str(home)
    env["KIMI_BATCH_LLAMA_PORT"] = str(free_port())  # nothing listens: the server is "down"
    return subprocess.run(
        [sys.executable, "-m", "kimi_batch.cli", "status", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


class InProcess:
    """`kimi-batch status ARGS` through `main` in this process, with the child's environment: only
    KIMI_BATCH_HOME and a port nothing listens on (a child would import Dagster again: seconds)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
        self._monkeypatch = monkeypatch
        self._capsys = capsys

    def __call__(self, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
        with self._monkeypatch.context() as env:
            for name in [k for k in os.environ if k.startswith("KIMI_BATCH_")]:
                env.delenv(name)
            env.setenv("KIMI_BATCH_HOME", str(home))
            env.setenv("KIMI_BATCH_LLAMA_PORT", str(free_port()))
            self._capsys.readouterr()
            code = main(["status", *args])
        out, err = self._capsys.readouterr()
        return subprocess.CompletedProcess(["kimi-batch", "status", *args], code, out, err)

    def json(self, home: Path) -> dict[str, Any]:
        done = self(home, "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)


@pytest.fixture
def status(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> InProcess:
    return InProcess(monkeypatch, capsys)


def test_a_mistyped_home_is_reported_and_never_created(tmp_path: Path, status: InProcess) -> None:
    typo = tmp_path / "vra"

    report = status.json(typo)

    assert not typo.exists()  # no folder, no partitions_start
    assert report["partitions"]["error"] == f"no Dagster instance at {typo / 'dagster'}"
    assert report["ledger"]["rows"] == 0


@pytest.mark.parametrize(
    ("content", "reason"),
    [(b"", "no such table: results"), (b"garbage " * 512, "file is not a database")],
)
def test_an_unreadable_ledger_is_reported_in_its_section(
    tmp_path: Path, status: InProcess, content: bytes, reason: str
) -> None:
    ledger = tmp_path / "ledger" / "ledger.sqlite3"
    ledger.parent.mkdir(parents=True)
    ledger.write_bytes(content)

    report = status.json(tmp_path)

    assert reason in report["ledger"]["error"]
    assert str(ledger) in report["ledger"]["error"]
    assert report["nightly"]["cron"]  # the other sections are there


def test_an_unreadable_duplicate_index_is_reported_in_the_quality_section(
    tmp_path: Path, status: InProcess
) -> None:
    index = tmp_path / "quality" / "dedup.sqlite3"
    index.parent.mkdir(parents=True)
    index.write_bytes(b"garbage " * 512)

    report = status.json(tmp_path)

    assert "file is not a database" in report["quality"]["error"]
    assert report["quality"]["dedup"] is True
    assert report["ledger"]["error"] is None  # the other sections are read


def test_an_unreadable_manifest_is_reported_in_the_inbox_section(
    tmp_path: Path, status: InProcess
) -> None:
    manifest = tmp_path / "landed" / "manifest.sqlite3"
    manifest.parent.mkdir(parents=True)
    manifest.write_bytes(b"not sqlite " * 512)
    (tmp_path / "inbox").mkdir()
    (tmp_path / "inbox" / "q.jsonl").write_text('{"prompt": "hi"}\n')

    text = status(tmp_path)
    report = status.json(tmp_path)

    assert text.returncode == 0, text.stderr
    assert "manifest" in report["inbox"]["error"]
    assert "file is not a database" in report["inbox"]["error"]
    assert report["inbox"]["waiting_files"] == ["q.jsonl"]
    assert "file is not a database" in text.stdout


def _garbled_start(home: Path, content: str) -> None:
    (home / "partitions_start").write_text(content)
    # With an instance, status reads the partitions (whose start date is this file).
    (home / "dagster").mkdir()
    shutil.copy(REPO_ROOT / "dagster.yaml", home / "dagster" / "dagster.yaml")


def _assert_refused_not_reset(
    done: subprocess.CompletedProcess[str], home: Path, content: str
) -> None:
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1, done.stderr
    assert "partitions_start" in done.stderr
    assert "YYYY-MM-DD" in done.stderr
    assert (home / "partitions_start").read_text() == content  # never rewritten


@pytest.mark.parametrize("content", ["", "yesterday\n"])
def test_a_garbled_partitions_start_is_refused_not_reset(
    tmp_path: Path, status: InProcess, content: str
) -> None:
    _garbled_start(tmp_path, content)

    done = status(tmp_path)

    _assert_refused_not_reset(done, tmp_path, content)


def test_a_partitions_start_that_is_not_text_is_refused_in_one_line(
    tmp_path: Path, status: InProcess
) -> None:
    """Found by review: bytes that are not UTF-8 raised a traceback."""
    _garbled_start(tmp_path, "")
    (tmp_path / "partitions_start").write_bytes(b"\xff\xfe2025\n")

    done = status(tmp_path)

    assert done.returncode == 2
    assert done.stderr.count("\n") == 1, done.stderr
    assert "partitions_start cannot be read as the install's first partition date" in done.stderr
    assert "KIMI_BATCH_PARTITIONS_START" in done.stderr


def test_the_refusal_is_one_line_from_a_fresh_process_too(tmp_path: Path) -> None:
    """A child imports Dagster afresh: a warning printed at import would be a second line."""
    _garbled_start(tmp_path, "")

    done = _status(tmp_path)

    _assert_refused_not_reset(done, tmp_path, "")


def _key(source: str) -> dg.MultiPartitionKey:
    return dg.MultiPartitionKey({DATE_DIMENSION: DAY, SOURCE_DIMENSION: source})


def _planned(run_id: str, key: str) -> EventLogEntry:
    """An attempt at a partition, as a run that planned it logs it."""
    event = DagsterEvent(
        event_type_value=DagsterEventType.ASSET_MATERIALIZATION_PLANNED.value,
        job_name="distillation_job",
        event_specific_data=AssetMaterializationPlannedData(
            dg.AssetKey("distilled_responses"), partition=key
        ),
    )
    return EventLogEntry(
        error_info=None,
        level="debug",
        user_message="",
        run_id=run_id,
        timestamp=datetime.now(UTC).timestamp(),
        dagster_event=event,
        job_name="distillation_job",
    )


def test_an_old_failure_stays_failed_however_many_runs_came_after(tmp_path: Path) -> None:
    @dg.asset(
        name="distilled_responses", partitions_def=build_batch_partitions(Settings.from_env())
    )
    def failing() -> None:
        raise RuntimeError("stand-in failure")

    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        instance.add_dynamic_partitions("source", ["old_failure", "busy"])
        failed = dg.materialize(
            [failing], partition_key=_key("old_failure"), instance=instance, raise_on_error=False
        )
        assert not failed.success
        # A busy month of later attempts at another partition (one run's log, to stay quick).
        later = str(uuid.uuid4())
        instance.event_log_storage.store_event_batch(
            [_planned(later, str(_key("busy"))) for _ in range(2001)]
        )
        states = distill_states(instance, [str(_key("old_failure"))])

    record = states[str(_key("old_failure"))]
    assert record.state == PartitionState.FAILED
    assert record.run_id == failed.run_id


def test_the_tables_section_shows_each_table_s_newest_snapshot_and_night_tag(
    tmp_path: Path, status: InProcess
) -> None:
    assert status.json(tmp_path)["tables"]["tables"] == {}
    assert not (tmp_path / "ledger").exists()  # the catalog is not created by a look
    warehouse = Warehouse(tmp_path / "warehouse")
    warehouse.write_partition("distilled", DAY, "a", distilled(amplified(2)))
    tagged = tag_night(warehouse, DAY)["distilled"]
    newest = warehouse.write_partition("distilled", DAY, "b", distilled(amplified(1))).snapshot_id

    report = status.json(tmp_path)["tables"]
    text = status(tmp_path).stdout

    assert report["error"] is None
    assert report["warehouse"] == str((tmp_path / "warehouse").resolve())
    assert set(report["tables"]) == {"distilled"}
    table = report["tables"]["distilled"]
    assert table["snapshot_id"] == newest
    assert datetime.fromisoformat(table["committed_at"]) <= datetime.now(UTC)
    assert (table["night_tag"], table["night_snapshot_id"]) == (f"night-{DAY}", tagged)
    assert f"  distilled: snapshot {newest} of " in text
    assert f"; night-{DAY} on {tagged}" in text
