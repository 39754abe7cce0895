"""The crash-point sweep (issue 42): stop the work at each durable write in turn, run it again,
and check that nothing was lost or made twice.

Three pieces of work reach every crash point the package declares (`declared_crash_points`),
each through the code the pipeline runs (`support/crash_night.py`, `support/crash_batch.py`,
`kimi-batch state migrate`): a partition's night (the nightly look at the inbox, landing, seeds
and input quarantine, the distill stage through the ledger, the quality gate; and
the same night again with the duplicate gate off), a Batch API batch from upload to finish (and
one whose run died first, finished by the sensor's logic), and the migration of a box's state
to PostgreSQL. Each test stops one of them at one
arrival of one point, with an exception in this process, or (the `slow` tier) with SIGKILL of a
worker process doing it; then the work runs again, as the next run would, and the invariants are
checked: every input line is a seed or a quarantined input line, every planned request is once a
row of its table or a quarantine row with its reason, one input version throughout, the ledger
and the tables agree, the duplicate index holds the kept rows, the batch's output holds each
answer once, every migrated row is there once.

Each piece's trace (the points it reaches, in order) is pinned below and checked against a
clean run, so a new crash point on these paths is swept as soon as it is added, and a point no
piece reaches fails `test_every_declared_crash_point_is_swept`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from kimi_batch.batch_api import ApiStore
from kimi_batch.cli.export import ExportRequest, run_export
from kimi_batch.cli.state import migrate_state
from kimi_batch.crash_points import (
    CRASH_AT_VARIABLE,
    CrashPointReached,
    armed,
    declared_crash_points,
    recording,
)
from kimi_batch.settings import Settings
from kimi_batch.state import connect_state
from kimi_batch.state.database import read_sqlite
from kimi_batch_tests.support.crash_batch import check_batch, run_batch
from kimi_batch_tests.support.crash_night import check_night, run_night, write_inbox
from kimi_batch_tests.support.exports import build_warehouse
from kimi_batch_tests.support.postgres import PostgresServer
from kimi_batch_tests.support.repo import REPO_ROOT
from kimi_batch_tests.support.rows import amplified
from kimi_batch_tests.support.s3proxy import BUCKET, S3Server

# Its slow tests start no llama-server: they run beside the ones that do (support/slow_split.py).
pytestmark = pytest.mark.no_llama_server

NIGHT_TRACE = [
    "landing.partition_assigned",  # the nightly look at the inbox (land_inbox)
    "landing.snapshot_copied",
    "landing.version_recorded",
    "landing.fingerprint",
    "warehouse.partition_committed",  # seeds
    "seeds.rows_written",
    "warehouse.partition_committed",  # input quarantine
    "quarantine.rows_replaced",
    "landing.seeds_consumed",
    "ledger.result_recorded",
    "ledger.result_recorded",
    "ledger.result_recorded",
    "warehouse.partition_committed",  # distilled
    "stage.rows_written",
    "warehouse.partition_committed",  # the stage's quarantine
    "quarantine.rows_replaced",
    "quality.index_updated",
    "warehouse.night_tagged",  # distilled, quarantine, seeds
    "warehouse.night_tagged",
    "warehouse.night_tagged",
]
# The same night again with the duplicate gate off (KIMI_BATCH_DEDUP=0): the stage landed
# unscreened takes the partition's rows out of the index.
GATE_OFF_TRACE = [
    "warehouse.partition_committed",  # distilled
    "stage.rows_written",
    "warehouse.partition_committed",  # the stage's quarantine
    "quarantine.rows_replaced",
    "quality.index_released",
    "warehouse.night_tagged",  # distilled, quarantine (seeds were not written again)
    "warehouse.night_tagged",
]
BATCH_TRACE = [
    "api.file_kept",  # the upload
    "api.batch_added",
    "api.validation_claimed",
    "landing.snapshot_copied",
    "landing.version_recorded",
    "api.batch_transitioned",  # landed (request total known)
    "api.batch_transitioned",  # in_progress
    "ledger.result_recorded",
    "ledger.result_recorded",
    "ledger.result_recorded",
    "api.batch_transitioned",  # finalizing
    "api.file_kept",  # the output file
    "api.batch_updated",
    "api.batch_transitioned",  # completed
    "api.file_deleted",
]
# The batch whose run dies before its finish: the sensor's logic finishes it (from the
# attempt's count on; before it, the batch's trace is BATCH_TRACE's).
ABANDONED_TRACE = [
    *BATCH_TRACE[: BATCH_TRACE.index("api.batch_transitioned") + 2],
    "ledger.result_recorded",
    "ledger.result_recorded",
    "ledger.result_recorded",
    "api.finish_attempt",
    "api.batch_updated",  # the run_failed error
    "api.file_kept",  # the output file
    "api.batch_updated",
    "api.batch_transitioned",  # failed
    "api.file_deleted",
]
# An hf export replacing the one before (`private_folder_swap`: the older folder set aside, the
# new one renamed in).
EXPORT_TRACE = ["export.folder_set_aside"]
MIGRATE_TRACE = [
    "state.store_copied",  # ledger
    "state.store_copied",  # manifest
    "state.store_copied",  # api
    "state.files_shared",
]
# The tables' maintenance of one table: the expiry's commit, then the orphan files' removal.
MAINTENANCE_TRACE = ["warehouse.snapshots_expired", "warehouse.orphans_removed"]
# Inside the validation step an exception is the batch's failure by design (`validate_batch`
# ends it `failed`, saying why, rather than leave it validating): these arrivals are swept with
# SIGKILL only, which is what stops a validation half way.
_VALIDATION = {("landing.snapshot_copied", 1), ("landing.version_recorded", 1)}
_VALIDATION |= {("api.batch_transitioned", 1)}

# The SIGKILL tier: the two-write steps first (seeds | input quarantine | consumed record;
# stage rows | stage quarantine | index), then a snapshot without its version, a ledger half
# filled, a batch's output file without its record, a migration half copied.
# The night's lease in the killed worker and in the rerun. At 1 s, a worker starved of CPU for
# a second lost its lease before reaching the crash point (seen once in the niced slow tier).
CRASH_LEASE_TTL_S = 15.0
NIGHT_KILLS = [
    ("seeds.rows_written", 1),
    ("quarantine.rows_replaced", 1),
    ("stage.rows_written", 1),
    ("quarantine.rows_replaced", 2),
    ("landing.snapshot_copied", 1),
    ("ledger.result_recorded", 2),
]
BATCH_KILLS = [
    ("api.validation_claimed", 1),
    ("landing.snapshot_copied", 1),
    ("landing.version_recorded", 1),
    ("api.batch_transitioned", 1),
    ("api.file_kept", 2),
    ("api.batch_updated", 1),
]


def _arrivals(trace: list[str]) -> list[tuple[str, int]]:
    """(point, its nth arrival) for each step of `trace`."""
    seen: dict[str, int] = {}
    steps: list[tuple[str, int]] = []
    for name in trace:
        seen[name] = seen.get(name, 0) + 1
        steps.append((name, seen[name]))
    return steps


def _id(step: tuple[str, int]) -> str:
    return f"{step[0]}#{step[1]}"


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """A fresh state dir in the default configuration (SQLite state, dedup on, no Trino)."""
    home = tmp_path / "home"
    monkeypatch.setenv("KIMI_BATCH_HOME", str(home))
    for name in ("KIMI_BATCH_DATABASE_URL", "KIMI_BATCH_TRINO_HOST", CRASH_AT_VARIABLE):
        monkeypatch.delenv(name, raising=False)
    write_inbox(home)
    return Settings.from_env()


def _crash_then_rerun(
    work: Callable[[Settings], None], settings: Settings, step: tuple[str, int]
) -> None:
    with armed(step[0], arrival=step[1]), pytest.raises(CrashPointReached):
        work(settings)
    work(settings)


# ---- the traces ---------------------------------------------------------------------------


def _gate_off(settings: Settings) -> Settings:
    return settings.model_copy(update={"dedup": False})


def _abandoned(settings: Settings) -> None:
    run_batch(settings, run_ends=True)


def test_each_piece_of_work_reaches_the_points_it_is_swept_at(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with recording() as night:
        run_night(settings)
    with recording() as gate_off:
        run_night(_gate_off(settings))
    with recording() as batch:
        run_batch(settings)
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path / "another"))
    with recording() as abandoned:
        _abandoned(Settings.from_env())
    assert (night, gate_off) == (NIGHT_TRACE, GATE_OFF_TRACE)
    assert (batch, abandoned) == (BATCH_TRACE, ABANDONED_TRACE)


def test_every_declared_crash_point_is_swept() -> None:
    swept = set(NIGHT_TRACE) | set(GATE_OFF_TRACE) | set(BATCH_TRACE) | set(ABANDONED_TRACE)
    swept |= set(EXPORT_TRACE) | set(MIGRATE_TRACE) | set(MAINTENANCE_TRACE)
    # A chat export's side file (--system-turn once): swept in cli/test_export_shapes.py.
    swept.add("export.system_side_file")
    declared = declared_crash_points()
    assert set(declared) <= swept, {n: w for n, w in declared.items() if n not in swept}
    assert swept <= set(declared)
    killed = {name for name, _ in NIGHT_KILLS + BATCH_KILLS}
    assert len(killed) >= 5


# ---- an exception at each point --------------------------------------------------------------


@pytest.mark.parametrize("step", _arrivals(NIGHT_TRACE), ids=_id)
def test_a_night_stopped_at_a_crash_point_is_whole_after_a_rerun(
    settings: Settings, step: tuple[str, int]
) -> None:
    _crash_then_rerun(run_night, settings, step)
    check_night(settings)


@pytest.mark.parametrize("step", _arrivals(GATE_OFF_TRACE), ids=_id)
def test_a_night_with_the_gate_off_stopped_at_a_crash_point_is_whole_after_a_rerun(
    settings: Settings, step: tuple[str, int]
) -> None:
    run_night(settings)  # a night with the gate on indexed the partition's rows
    _crash_then_rerun(run_night, _gate_off(settings), step)
    check_night(_gate_off(settings))


@pytest.mark.parametrize(
    "step", [s for s in _arrivals(BATCH_TRACE) if s not in _VALIDATION], ids=_id
)
def test_a_batch_stopped_at_a_crash_point_is_whole_after_a_rerun(
    settings: Settings, step: tuple[str, int]
) -> None:
    _crash_then_rerun(run_batch, settings, step)
    check_batch(settings)


@pytest.mark.parametrize(
    "step", _arrivals(ABANDONED_TRACE)[ABANDONED_TRACE.index("api.finish_attempt") :], ids=_id
)
def test_a_batch_finished_after_its_run_died_stopped_at_a_crash_point_is_whole_after_a_rerun(
    settings: Settings, step: tuple[str, int]
) -> None:
    _crash_then_rerun(_abandoned, settings, step)
    check_batch(settings, run_ends=True)


@pytest.mark.parametrize("step", NIGHT_KILLS, ids=_id)
def test_a_night_on_postgresql_stopped_at_a_crash_point_is_whole_after_a_rerun(
    postgres_server: PostgresServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    step: tuple[str, int],
) -> None:
    # The state a team shares (ledger, leases, manifest, duplicate index in PostgreSQL).
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KIMI_BATCH_DATABASE_URL", postgres_server.new_database())
    write_inbox(tmp_path / "home")
    settings = Settings.from_env()
    _crash_then_rerun(run_night, settings, step)
    check_night(settings)


@pytest.mark.slow  # the S3 server
@pytest.mark.parametrize(
    "step", [s for s in _arrivals(NIGHT_TRACE) if s[0] == "warehouse.partition_committed"], ids=_id
)
def test_a_night_on_an_object_store_stopped_at_a_commit_is_whole_after_a_rerun(
    s3proxy_server: S3Server,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    step: tuple[str, int],
) -> None:
    # The warehouse a deployment without a shared volume has (issue 42 item 3 was found here).
    for name, value in s3proxy_server.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KIMI_BATCH_WAREHOUSE", f"s3://{BUCKET}/t-{uuid.uuid4().hex[:12]}")
    monkeypatch.setenv("KIMI_BATCH_S3_ENDPOINT", s3proxy_server.endpoint)
    monkeypatch.setenv("KIMI_BATCH_S3_REGION", s3proxy_server.env["AWS_REGION"])
    write_inbox(tmp_path / "home")
    settings = Settings.from_env()
    _crash_then_rerun(run_night, settings, step)
    check_night(settings)


def test_a_finish_stopped_after_its_output_file_leaves_one_output_file(
    settings: Settings,
) -> None:
    _crash_then_rerun(run_batch, settings, ("api.file_kept", 2))
    with ApiStore(settings.paths) as store:
        outputs = [f for f in store.files() if f.purpose == "batch_output"]
    assert len(outputs) == 1


def _maintain(settings: Settings) -> None:
    """Every snapshot but the current one expired, every file past the safety age judged (the
    clock two days on)."""
    from kimi_batch.warehouse import open_warehouse
    from kimi_batch.warehouse.maintenance import maintain

    later = datetime.now(UTC) + timedelta(days=2)
    maintain(open_warehouse(settings), retention=timedelta(0), now=later)


@pytest.mark.parametrize("step", _arrivals(MAINTENANCE_TRACE), ids=_id)
def test_maintenance_stopped_at_a_crash_point_leaves_the_table_whole_after_a_rerun(
    settings: Settings, step: tuple[str, int]
) -> None:
    from kimi_batch.warehouse import open_warehouse
    from kimi_batch.warehouse.maintenance import referenced_files

    warehouse = open_warehouse(settings)
    for rows in (3, 2, 4):
        warehouse.write_partition("amplified", "2024-05-01", "demo", amplified(rows))
    with recording() as trace, armed(step[0], arrival=step[1]), pytest.raises(CrashPointReached):
        _maintain(settings)
    assert trace == MAINTENANCE_TRACE[: MAINTENANCE_TRACE.index(step[0]) + step[1]]
    assert warehouse.count("amplified") == 4
    _maintain(settings)
    iceberg = warehouse.iceberg_table("amplified")
    assert iceberg is not None
    assert len(iceberg.metadata.snapshots) == 1
    assert warehouse.read_partition("amplified", "2024-05-01", "demo").height == 4
    root = Path(iceberg.location().removeprefix("file://"))
    files = {str(path) for path in root.rglob("*") if path.is_file()}
    assert files <= referenced_files(iceberg)


def _export(settings: Settings) -> Path:
    request = ExportRequest(fmt="hf", out=settings.paths.home / "exports" / "night.hf")
    return run_export(settings, request)


@pytest.mark.parametrize("step", _arrivals(EXPORT_TRACE), ids=_id)
def test_an_hf_export_stopped_at_a_crash_point_keeps_the_earlier_one_until_a_rerun(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, step: tuple[str, int]
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    build_warehouse(settings)
    folder = _export(settings)
    card = (folder / "README.md").read_bytes()
    files = sorted(path.relative_to(folder) for path in folder.rglob("*"))
    with recording() as trace, armed(step[0], arrival=step[1]), pytest.raises(CrashPointReached):
        _export(settings)
    assert trace == EXPORT_TRACE[: EXPORT_TRACE.index(step[0]) + step[1]]
    assert (folder / "README.md").read_bytes() == card  # the earlier export, whole
    assert _export(settings) == folder
    assert [path.name for path in folder.parent.iterdir()] == [folder.name]
    assert sorted(path.relative_to(folder) for path in folder.rglob("*")) == files


def _migrated(settings: Settings, url: str) -> None:
    """Every row of the box's three stores is in the database once, and the files they name."""
    source, target = settings.paths, settings.paths.model_copy(update={"database_url": url})
    for path, location, leave_out in (
        (source.ledger_path, target.ledger_state, {"leases"}),
        (source.manifest_path, target.manifest_state, set()),
        (source.api_db_path, target.api_state, set()),
    ):
        box = read_sqlite(path)
        assert box is not None
        with box, connect_state(location) as db:
            for table in sorted(set(box.tables()) - leave_out):
                (mine,) = box.execute(f"SELECT count(*) FROM {table}").fetchone()
                (theirs,) = db.execute(f"SELECT count(*) FROM {table}").fetchone()
                assert (table, mine) == (table, theirs)
    with connect_state(target.manifest_state) as db:
        (blobs,) = db.execute("SELECT count(*) FROM blobs").fetchone()
    assert blobs == 2  # the night's input and the batch's, landed


@pytest.fixture
def box_to_migrate(settings: Settings) -> Settings:
    """A box that ran a night and a batch, on SQLite."""
    run_night(settings)
    run_batch(settings)
    return settings


@pytest.mark.parametrize("step", _arrivals(MIGRATE_TRACE), ids=_id)
def test_a_migration_stopped_at_a_crash_point_is_whole_after_a_rerun(
    box_to_migrate: Settings, postgres_server: PostgresServer, step: tuple[str, int]
) -> None:
    url = postgres_server.new_database()
    with recording() as trace, armed(step[0], arrival=step[1]), pytest.raises(CrashPointReached):
        migrate_state(box_to_migrate, url)
    assert trace == MIGRATE_TRACE[: MIGRATE_TRACE.index(step[0]) + step[1]]
    migrate_state(box_to_migrate, url)
    _migrated(box_to_migrate, url)


# ---- SIGKILL of a worker at the two-write steps and more -------------------------------------


def _killed_worker(module: str, settings: Settings, step: tuple[str, int]) -> None:
    """Run `module`'s work in a child process killed (SIGKILL) at `step`."""
    env = {
        **os.environ,
        "KIMI_BATCH_HOME": str(settings.paths.home),
        CRASH_AT_VARIABLE: f"{step[0]}:kill:{step[1]}",
        # Long enough that a worker starved of CPU for seconds (`make test` runs these tests
        # niced, beside the llama-server ones) still renews its lease before the crash point;
        # the rerun takes a dead worker's lease at once.
        "CRASH_NIGHT_TTL_S": str(CRASH_LEASE_TTL_S),
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    child = subprocess.run(
        [sys.executable, "-m", module], env=env, capture_output=True, text=True, timeout=300
    )
    assert child.returncode == -9, (child.returncode, child.stderr[-2000:])


@pytest.mark.slow  # a worker process each
@pytest.mark.parametrize("step", NIGHT_KILLS, ids=_id)
def test_a_night_killed_at_a_crash_point_is_whole_after_a_rerun(
    settings: Settings, step: tuple[str, int]
) -> None:
    _killed_worker("kimi_batch_tests.support.crash_night", settings, step)
    # Takes the dead worker's lease over at once: its holder process has exited.
    run_night(settings, ttl_s=CRASH_LEASE_TTL_S)
    check_night(settings)


@pytest.mark.slow  # a worker process each
@pytest.mark.parametrize("step", BATCH_KILLS, ids=_id)
def test_a_batch_killed_at_a_crash_point_is_whole_after_a_rerun(
    settings: Settings, step: tuple[str, int]
) -> None:
    _killed_worker("kimi_batch_tests.support.crash_batch", settings, step)
    run_batch(settings)
    check_batch(settings)
