"""The inbox sensor ticked on a real temporary instance, over real files.

`SensorDaemon` does per tick what the Dagster sensor daemon does with a tick's result: it adds the
requested dynamic partitions, stores the cursor, skips run keys that already have a run of this
sensor, and executes the others on the same instance (against stand-in assets that resolve their
file with the real `resolve_source_file`). The sensor itself is the real one.

Unreadable files, honestly: tests run as root here, so `chmod 000` would not stop a read. A file
that vanishes mid-tick is deleted by a wrapper around the inbox file opener just before the real
open (the FileNotFoundError is the real one); a file that cannot be read and becomes readable again is
the only simulated error (a wrapper raising PermissionError once). A symlink out of the inbox (to
`/proc/self/mem`, whose read would fail with EIO, or to a secret) is refused without any read.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import dagster as dg
import pytest

import kimi_batch.inputs.inbox as inbox_module
from kimi_batch.defs import sensors
from kimi_batch.defs.sensors import FILE_TAG, build_inbox_sensor
from kimi_batch.inputs.inbox import InboxFile, file_sha256, scan_inbox
from kimi_batch.inputs.inbox_tick import InboxCursor, plan_inbox_tick
from kimi_batch.inputs.landing import Assignment, Landing
from kimi_batch.inputs.partition_input import LandingIOError
from kimi_batch.paths import StatePaths
from kimi_batch.pipeline import known_partitions
from kimi_batch.settings import Settings
from kimi_batch_tests.support.inbox_files import put
from kimi_batch_tests.support.postgres import PostgresServer
from kimi_batch_tests.support.standins import standin_definitions

# Dagster's own multi-partition tags (`dagster/partition/date`) trip its tag-key deprecation.
pytestmark = pytest.mark.filterwarnings("ignore:Non-compliant tag keys:DeprecationWarning")

DAY = "2025-06-01"
PROC_MEM = Path("/proc/self/mem")


@dataclass
class Tick:
    data: dg.SensorExecutionData
    launched: list[dg.RunRequest]
    results: list[dg.ExecuteInProcessResult]

    @property
    def run_keys(self) -> list[str | None]:
        return [request.run_key for request in self.data.run_requests]


@dataclass
class SensorDaemon:
    instance: dg.DagsterInstance
    defs: dg.Definitions
    cursor: str | None = None
    ticks: list[Tick] = field(default_factory=list)

    @property
    def sensor(self) -> dg.SensorDefinition:
        return self.defs.resolve_sensor_def("inbox_sensor")

    def tick(self, *, execute: bool = True) -> Tick:
        """One tick; `execute=False` stops after partitions and cursor (no runs, no dedup)."""
        context = dg.build_sensor_context(
            instance=self.instance,
            instance_ref=self.instance.get_ref(),  # as in the daemon: partitions load from it
            cursor=self.cursor,
            definitions=self.defs,
            sensor_name=self.sensor.name,
        )
        data = self.sensor.evaluate_tick(context)
        for request in data.dynamic_partitions_requests or []:
            assert isinstance(request, dg.AddDynamicPartitionsRequest)
            self.instance.add_dynamic_partitions(
                request.partitions_def_name, list(request.partition_keys)
            )
        self.cursor = data.cursor
        launched: list[dg.RunRequest] = []
        results: list[dg.ExecuteInProcessResult] = []
        for request in (data.run_requests or []) if execute else []:
            assert request.run_key is not None
            if self._has_run(request.run_key):
                continue
            launched.append(request)
            results.append(self._execute(request))
        tick = Tick(data=data, launched=launched, results=results)
        self.ticks.append(tick)
        return tick

    def _has_run(self, run_key: str) -> bool:
        tags = {"dagster/run_key": run_key, "dagster/sensor_name": self.sensor.name}
        return bool(self.instance.get_run_records(filters=dg.RunsFilter(tags=tags), limit=1))

    def _execute(self, request: dg.RunRequest) -> dg.ExecuteInProcessResult:
        job = self.defs.resolve_job_def(str(self.sensor.job_name))
        tags = {k: v for k, v in request.tags.items() if not k.startswith("dagster/partition")}
        assert request.run_key is not None
        return job.execute_in_process(
            instance=self.instance,
            partition_key=request.partition_key,
            tags={**tags, "dagster/run_key": request.run_key},
        )


@pytest.fixture
def daemon(inbox: Path) -> Iterator[SensorDaemon]:
    # After `inbox`: the definitions are built for the state dir it points KIMI_BATCH_HOME at.
    with dg.instance_for_test() as instance:
        yield SensorDaemon(instance=instance, defs=standin_definitions())


def key(source: str, ds: str = DAY) -> dg.MultiPartitionKey:
    return dg.MultiPartitionKey({"date": ds, "source": source})


def materialized_file(result: dg.ExecuteInProcessResult) -> str:
    (event,) = result.asset_materializations_for_node("seed_prompts")
    value = event.metadata["file"].value
    assert isinstance(value, str)
    return value


def test_new_file_adds_its_partition_and_runs_ingest(inbox: Path, daemon: SensorDaemon) -> None:
    path = put(inbox / DAY / "seeds.jsonl")

    tick = daemon.tick()

    (request,) = tick.launched
    assert request.run_key == f"{DAY}/seeds.jsonl:{file_sha256(path)[:16]}"
    assert request.partition_key == key("seeds")
    assert request.tags[FILE_TAG] == f"{DAY}/seeds.jsonl"
    assert request.job_name in (None, "ingest_job")
    assert daemon.instance.get_dynamic_partitions("source") == ["seeds"]
    (result,) = tick.results
    assert result.success
    # The run found the same file through resolve_source_file: sensor and asset agree.
    assert materialized_file(result) == f"{DAY}/seeds.jsonl"


def test_root_file_partition_is_the_day_it_arrived_not_its_mtime(
    inbox: Path, daemon: SensorDaemon
) -> None:
    # Copied with `cp -p` from an archive: a 2019 mtime, before the partitions even start.
    path = put(inbox / "Loose Seeds.csv", "prompt\nhi\n", age_s=7 * 365 * 86400)

    (request,) = daemon.tick().launched

    assert request.partition_key == key("loose_seeds", Settings.from_env().today().isoformat())
    assert request.run_key == f"Loose Seeds.csv:{file_sha256(path)[:16]}"


def test_a_new_file_of_the_same_stem_never_moves_an_ingested_partition(
    inbox: Path, daemon: SensorDaemon
) -> None:
    put(inbox / DAY / "seeds.jsonl")
    (first,) = daemon.tick().launched
    put(inbox / DAY / "seeds.csv", "prompt\nhi\n")

    (second,) = daemon.tick().launched
    put(inbox / DAY / "seeds.jsonl", '{"prompt": "edited"}\n', age_s=30)
    (third,) = daemon.tick().launched

    assert first.partition_key == key("seeds")
    assert second.partition_key == key("seeds_csv")
    assert third.partition_key == key("seeds")  # a new version of the same partition


def test_arrival_day_is_taken_in_the_schedules_timezone(
    inbox: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 20:00 UTC is already tomorrow in Tokyo: the nightly "day that just ended" is Tokyo's.
    monkeypatch.setenv("KIMI_BATCH_TIMEZONE", "Asia/Tokyo")
    from datetime import UTC, datetime

    settings = Settings.from_env()
    assert settings.today(datetime(2026, 11, 30, 20, 0, tzinfo=UTC)).isoformat() == "2026-12-01"
    monkeypatch.setenv("KIMI_BATCH_TIMEZONE", "UTC")
    assert Settings.from_env().today(datetime(2026, 11, 30, 20, 0, tzinfo=UTC)).isoformat() == (
        "2026-11-30"
    )


def test_unchanged_file_never_runs_twice(inbox: Path, daemon: SensorDaemon) -> None:
    put(inbox / DAY / "seeds.jsonl")
    first = daemon.tick()
    cursor = daemon.cursor

    second = daemon.tick()

    assert len(first.launched) == 1
    assert second.data.run_requests == []
    assert second.data.skip_message is not None
    assert "1 unchanged" in second.data.skip_message
    assert daemon.cursor == cursor

    # Even with the cursor lost, the same content asks under the same run key: no second run.
    daemon.cursor = None
    third = daemon.tick()
    assert third.run_keys == first.run_keys
    assert third.launched == []
    assert len(daemon.instance.get_run_records()) == 1


def test_changed_file_runs_again_touched_file_does_not(inbox: Path, daemon: SensorDaemon) -> None:
    path = put(inbox / DAY / "seeds.jsonl")
    first = daemon.tick()

    past = time.time() - 30
    os.utime(path, (past, past))  # touched: new mtime, same bytes
    touched = daemon.tick()
    put(path, '{"prompt": "a different question"}\n', age_s=20)
    changed = daemon.tick()

    assert touched.data.run_requests == []
    (request,) = changed.launched
    assert request.run_key == f"{DAY}/seeds.jsonl:{file_sha256(path)[:16]}"
    assert request.run_key != first.launched[0].run_key
    assert request.partition_key == key("seeds")
    assert all(result.success for result in first.results + changed.results)
    assert len(daemon.instance.get_run_records()) == 2


@pytest.mark.skipif(not PROC_MEM.is_file(), reason="needs Linux /proc/self/mem")
def test_links_out_of_the_inbox_and_bad_names_are_requested_for_quarantine_unread(
    inbox: Path, daemon: SensorDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sensors, "SETTLE_S", 0.0)  # the proc file's mtime is "now"
    (inbox / DAY).mkdir()
    (inbox / DAY / "broken.jsonl").symlink_to(PROC_MEM)  # read() would fail with EIO
    with open(os.path.join(os.fsencode(inbox / DAY), b"caf\xe9.jsonl"), "wb") as handle:
        handle.write(b'{"prompt": "hi"}\n')
    good = put(inbox / DAY / "good.jsonl")
    reads: list[str] = []
    real_open: Callable[[Path, str], BinaryIO] = inbox_module.open_inbox_file

    def counting(inbox_dir: Path, name: str) -> BinaryIO:
        reads.append(Path(name).name)
        return real_open(inbox_dir, name)

    monkeypatch.setattr(inbox_module, "open_inbox_file", counting)

    tick = daemon.tick()

    by_source = {request.partition_key: request for request in tick.launched}
    assert set(by_source) == {key("broken"), key("caf_xe9"), key("good")}
    assert set(reads) == {"good.jsonl"}  # hashed by the sensor, landed by its run: no other
    assert by_source[key("good")].run_key == f"{DAY}/good.jsonl:{file_sha256(good)[:16]}"
    broken = by_source[key("broken")]
    assert broken.run_key is not None
    assert broken.run_key.startswith(f"{DAY}/broken.jsonl:unread:")
    assert broken.tags["kimi_batch/sha256"] == "unread"
    assert all(result.success for result in tick.results)
    problems = [
        str(r.asset_materializations_for_node("seed_prompts")[0].metadata["problem"].value)
        for r in tick.results
    ]
    assert any("outside the inbox" in str(p) for p in problems)
    assert any("not valid UTF-8" in str(p) for p in problems)

    # Requested once: the next tick asks for nothing.
    again = daemon.tick()
    assert again.data.run_requests == []


def test_a_huge_file_never_stalls_a_tick(inbox: Path, daemon: SensorDaemon) -> None:
    huge = inbox / DAY / "huge.jsonl"
    huge.parent.mkdir()
    with huge.open("wb") as handle:
        handle.truncate(12 * (1 << 30))  # 12 GiB, sparse: hashing it would outlast the tick
    past = time.time() - 60
    os.utime(huge, (past, past))
    put(inbox / DAY / "small.jsonl")

    started = time.monotonic()
    tick = daemon.tick()

    assert time.monotonic() - started < 30
    keys = sorted(str(r.run_key) for r in tick.launched)
    assert keys[0].startswith(f"{DAY}/huge.jsonl:unread:")
    assert keys[1].startswith(f"{DAY}/small.jsonl:")
    (huge_run,) = [r for r in tick.results if "huge" in str(r.dagster_run.tags)]
    problem = huge_run.asset_materializations_for_node("seed_prompts")[0].metadata["problem"]
    assert "KIMI_BATCH_MAX_INPUT_MB" in str(problem.value)


def test_file_vanishing_mid_tick_is_skipped(
    inbox: Path, daemon: SensorDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    doomed = put(inbox / DAY / "doomed.jsonl")
    put(inbox / DAY / "kept.jsonl")
    real_open: Callable[[Path, str], BinaryIO] = inbox_module.open_inbox_file

    def delete_then_open(inbox_dir: Path, name: str) -> BinaryIO:
        if Path(name).name == doomed.name:
            (inbox_dir / name).unlink()  # listed by the scan, gone by the time it is read
        return real_open(inbox_dir, name)

    monkeypatch.setattr(inbox_module, "open_inbox_file", delete_then_open)

    tick = daemon.tick()

    assert [request.partition_key for request in tick.launched] == [key("kept")]
    assert f"{DAY}/doomed.jsonl" not in InboxCursor.parse(daemon.cursor).root


def test_file_that_heals_runs_under_its_content_key(
    inbox: Path, daemon: SensorDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = put(inbox / DAY / "flaky.jsonl")
    real_open: Callable[[Path, str], BinaryIO] = inbox_module.open_inbox_file
    calls = {"n": 0}

    def denied_once(inbox_dir: Path, name: str) -> BinaryIO:  # simulated: a permission fixed
        calls["n"] += 1  # between two ticks
        if calls["n"] == 1:
            raise PermissionError(13, "Permission denied", str(inbox_dir / name))
        return real_open(inbox_dir, name)

    monkeypatch.setattr(inbox_module, "open_inbox_file", denied_once)

    first = daemon.tick()
    second = daemon.tick()

    assert [r.run_key for r in first.launched] == [
        f"{DAY}/flaky.jsonl:unreadable:{path.stat().st_mtime_ns}:{path.stat().st_size}"
    ]
    assert [r.run_key for r in second.launched] == [f"{DAY}/flaky.jsonl:{file_sha256(path)[:16]}"]


def test_file_still_being_written_waits_for_a_later_tick(inbox: Path, daemon: SensorDaemon) -> None:
    path = put(inbox / DAY / "uploading.jsonl", age_s=0)

    early = daemon.tick()
    past = time.time() - 60
    os.utime(path, (past, past))
    later = daemon.tick()

    assert early.data.run_requests == []
    assert early.data.skip_message is not None
    assert "1 deferred" in early.data.skip_message
    assert [request.partition_key for request in later.launched] == [key("uploading")]


def test_early_dates_land_on_the_first_partition_and_future_ones_wait(
    inbox: Path, daemon: SensorDaemon
) -> None:
    put(inbox / "2024-12-31" / "before_start.jsonl")
    put(inbox / "2999-01-01" / "far_future.jsonl")
    put(inbox / DAY / "fine.jsonl")

    tick = daemon.tick()

    start = Settings.from_env().first_partition_date().isoformat()
    assert sorted(str(r.partition_key) for r in tick.launched) == sorted(
        [str(key("before_start", start)), str(key("fine"))]
    )
    plan = plan_inbox_tick(
        scan_inbox(inbox),
        InboxCursor(),
        assign=_assign(inbox),
        is_valid_ds=lambda ds: ds < "2999",
        max_input_bytes=1 << 20,
    )
    assert any("before the first partition; landed on" in w for w in plan.warnings)
    cursor = InboxCursor.parse(daemon.cursor).root
    assert "2999-01-01/far_future.jsonl" not in cursor  # looked at again later


def test_cursor_keeps_ticks_cheap_with_thousands_of_files(
    inbox: Path, daemon: SensorDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    count = 2000
    past = time.time() - 60
    for index in range(count):
        path = inbox / DAY / f"part_{index:05d}.jsonl"
        path.parent.mkdir(exist_ok=True)
        path.write_text(f'{{"prompt": "question {index}"}}\n')
        os.utime(path, (past, past))
    real_open: Callable[[Path, str], BinaryIO] = inbox_module.open_inbox_file
    hashed: list[str] = []

    def counting(inbox_dir: Path, name: str) -> BinaryIO:
        hashed.append(Path(name).name)
        return real_open(inbox_dir, name)

    monkeypatch.setattr(inbox_module, "open_inbox_file", counting)

    first = daemon.tick(execute=False)
    assert len(first.data.run_requests) == count
    assert len(hashed) == count
    assert len(daemon.instance.get_dynamic_partitions("source")) == count

    hashed.clear()
    # CPU time, not wall time: the test tiers share 2 cores, this one niced.
    started = time.process_time()
    second = daemon.tick(execute=False)
    used = time.process_time() - started
    assert hashed == []
    assert second.data.run_requests == []
    assert used < 10.0, f"an idle tick over {count} files took {used:.1f} CPU seconds"

    put(inbox / DAY / "part_00007.jsonl", '{"prompt": "edited"}\n', age_s=30)
    third = daemon.tick(execute=False)
    assert hashed == ["part_00007.jsonl"]
    assert [request.partition_key for request in third.data.run_requests] == [key("part_00007")]


def test_missing_inbox_is_a_skip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path / "nowhere"))
    with dg.instance_for_test() as instance:
        daemon = SensorDaemon(instance=instance, defs=standin_definitions())
        tick = daemon.tick()

    assert tick.data.run_requests == []
    assert tick.data.skip_message is not None
    assert "does not exist" in tick.data.skip_message


def test_sensor_definition_defaults() -> None:
    inbox_sensor = build_inbox_sensor(Settings.from_env())
    assert inbox_sensor.job_name == "ingest_job"
    assert inbox_sensor.minimum_interval_seconds == Settings.from_env().inbox_sensor_interval_s
    if not Settings.from_env().inbox_sensor_running:
        assert inbox_sensor.default_status == dg.DefaultSensorStatus.STOPPED
    assert inbox_sensor.description


def _assign(inbox: Path) -> Callable[[InboxFile], Assignment]:
    landing = Landing(StatePaths(home=inbox.parent))
    settings = Settings.from_env()
    return lambda item: landing.assign_file(
        item, arrived=settings.today(), start=settings.first_partition_date()
    )


def test_a_landing_that_failed_on_an_io_error_is_asked_for_again_next_tick(
    inbox: Path, daemon: SensorDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = put(inbox / DAY / "seeds.jsonl")

    def disk_full(_fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as patched:
        patched.setattr(os, "fsync", disk_full)  # the copy into landed/ cannot be flushed
        with pytest.raises(LandingIOError):  # the stand-in's step fails: nothing was landed
            daemon.tick()
    (failed,) = daemon.instance.get_runs()
    assert failed.status == dg.DagsterRunStatus.FAILURE

    healed = daemon.tick()  # same file, same cursor entry: asked for again after the failure

    (request,) = healed.launched
    assert (
        request.run_key == f"{DAY}/seeds.jsonl:{file_sha256(path)[:16]}:after:{failed.run_id[:8]}"
    )
    (result,) = healed.results
    assert result.success
    assert daemon.tick(execute=False).data.run_requests == []  # landed now: nothing more


def test_a_file_changed_back_to_an_earlier_content_runs_again_and_lands_as_the_newest(
    inbox: Path, daemon: SensorDaemon
) -> None:
    path = put(inbox / DAY / "seeds.jsonl", '{"prompt": "A"}\n', age_s=90)
    first = daemon.tick()
    put(path, '{"prompt": "B"}\n', age_s=60)
    second = daemon.tick()
    put(path, '{"prompt": "A"}\n', age_s=30)  # A -> B -> A
    third = daemon.tick()
    daemon.cursor = None  # lost cursor: A is landed and newest, its run key is the same again
    fourth = daemon.tick()

    sha_a = file_sha256(path)
    assert [len(tick.launched) for tick in (first, second, third)] == [1, 1, 1]
    # The same content, a new event: a new run key, not the day-1 one the daemon already ran.
    assert third.run_keys == [f"{DAY}/seeds.jsonl:{sha_a[:16]}:landed-again:1"]
    assert first.run_keys == [f"{DAY}/seeds.jsonl:{sha_a[:16]}"]
    assert fourth.run_keys == third.run_keys
    assert fourth.launched == []
    with Landing(StatePaths(home=inbox.parent)) as landing:
        current = landing.current(DAY, "seeds")
        assert landing.earlier_landings(DAY, "seeds", sha_a) == 1
    assert current is not None
    assert current.sha256 == sha_a


def test_a_reverted_file_whose_landing_failed_is_asked_for_again(
    inbox: Path, daemon: SensorDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = put(inbox / DAY / "seeds.jsonl", '{"prompt": "A"}\n', age_s=90)
    daemon.tick()
    put(path, '{"prompt": "B"}\n', age_s=60)
    daemon.tick()
    put(path, '{"prompt": "A"}\n', age_s=30)

    def disk_full(_fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as patched:
        patched.setattr(os, "fsync", disk_full)
        with pytest.raises(LandingIOError):
            daemon.tick()
    failed = daemon.instance.get_runs(limit=1)[0]
    assert failed.status == dg.DagsterRunStatus.FAILURE

    # A was landed on day 1, but B is the newest version: A is not landed, so it is asked again.
    (request,) = daemon.tick().launched
    assert str(request.run_key).endswith(f":after:{failed.run_id[:8]}")
    with Landing(StatePaths(home=inbox.parent)) as landing:
        current = landing.current(DAY, "seeds")
    assert current is not None
    assert current.sha256 == file_sha256(path)


# ---- the state in PostgreSQL: the sensor lands, a run on any host reads the snapshot -----------


def _worker_elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The settings of a run worker on another host: its own state dir (no inbox), same database."""
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path / "run-host"))
    return Settings.from_env()


def test_with_the_state_in_postgres_the_sensor_lands_the_file_and_its_run_needs_no_inbox(
    inbox: Path,
    tmp_path: Path,
    postgres_server: PostgresServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KIMI_BATCH_DATABASE_URL", postgres_server.new_database())
    text = '{"prompt": "only the code server sees the inbox"}\n'
    put(inbox / DAY / "shared.jsonl", text)
    with dg.instance_for_test() as instance:
        code_server = SensorDaemon(instance=instance, defs=standin_definitions())
        (request,) = code_server.tick(execute=False).data.run_requests
        elsewhere = _worker_elsewhere(tmp_path, monkeypatch)
        worker = SensorDaemon(instance=instance, defs=standin_definitions(elsewhere))
        result = worker._execute(request)
    assert result.success
    (event,) = result.asset_materializations_for_node("seed_prompts")
    assert event.metadata["problem"].value == ""
    assert event.metadata["bytes"].value == len(text)
    assert not elsewhere.paths.inbox_dir.exists()
    (snapshot,) = elsewhere.paths.landed_dir.glob("*.jsonl")
    assert snapshot.read_text() == text


def test_landing_in_the_sensor_is_bounded_and_the_rest_is_asked_for_next_tick(
    inbox: Path, postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KIMI_BATCH_DATABASE_URL", postgres_server.new_database())
    monkeypatch.setattr(sensors, "LAND_BUDGET_S", 0.0)  # spent by the first landing
    put(inbox / DAY / "first.jsonl")
    put(inbox / DAY / "second.jsonl", '{"prompt": "two"}\n')
    with dg.instance_for_test() as instance:
        code_server = SensorDaemon(instance=instance, defs=standin_definitions())
        first = code_server.tick(execute=False).data.run_requests
        second = code_server.tick(execute=False).data.run_requests
        third = code_server.tick(execute=False).data.run_requests
    assert [r.tags[FILE_TAG] for r in [*first, *second]] == [
        f"{DAY}/first.jsonl",
        f"{DAY}/second.jsonl",
    ]
    assert third == []
    with Landing(Settings.from_env().paths) as landing:
        assert [landing.current(DAY, s) is not None for s in ("first", "second")] == [True, True]


def test_on_one_box_the_sensor_lands_nothing_its_run_does(
    inbox: Path, daemon: SensorDaemon
) -> None:
    put(inbox / DAY / "local.jsonl")
    (request,) = daemon.tick(execute=False).data.run_requests
    with Landing(Settings.from_env().paths) as landing:
        assert landing.current(DAY, "local") is None
    assert daemon._execute(request).success  # the run lands it
    with Landing(Settings.from_env().paths) as landing:
        assert landing.current(DAY, "local") is not None


# ---- the night lands inbox files too: the sensor neither runs them twice nor skips a change ----


def _night(inbox: Path, *, builds: bool = True) -> list[str]:
    """What a night does to the inbox before the sensor ticks again: its look lands every settled
    file whose content is not its partition's newest (the night's own `known_partitions`), then,
    `builds`, its run writes each partition's seeds from that version (the record `land_input`
    makes after both writes). The names landed."""
    settings = Settings.from_env()
    _, _, look = known_partitions(settings, DAY, lambda ds: True)
    with Landing(settings.paths) as landing:
        for version in look.landed if builds else []:
            landing.record_consumed(version.ds, version.source, version.sha256)
    return [version.name for version in look.landed]


def test_a_file_the_night_landed_and_built_starts_no_second_run(
    inbox: Path, daemon: SensorDaemon
) -> None:
    put(inbox / DAY / "seeds.jsonl")
    assert _night(inbox) == [f"{DAY}/seeds.jsonl"]

    tick = daemon.tick()

    assert tick.data.run_requests == []
    assert tick.data.skip_message is not None
    assert "1 already built" in tick.data.skip_message
    assert daemon.instance.get_run_records() == []
    assert daemon.tick().data.run_requests == []  # and the cursor keeps it so


def test_a_file_the_night_landed_but_did_not_build_is_still_started(
    inbox: Path, daemon: SensorDaemon
) -> None:
    # The night's look landed it, but its run never wrote the seeds (it failed, or stopped):
    # the sensor starts it, under the key a first landing has.
    path = put(inbox / DAY / "seeds.jsonl")
    _night(inbox, builds=False)

    (request,) = daemon.tick().launched

    assert request.run_key == f"{DAY}/seeds.jsonl:{file_sha256(path)[:16]}"


def test_a_rewrite_the_night_built_before_the_sensor_saw_it_starts_no_second_run(
    inbox: Path, daemon: SensorDaemon
) -> None:
    path = put(inbox / DAY / "seeds.jsonl", '{"prompt": "A"}\n', age_s=90)
    (first,) = daemon.tick().launched
    put(path, '{"prompt": "B"}\n', age_s=60)
    assert _night(inbox) == [f"{DAY}/seeds.jsonl"]  # B landed and built by the night

    tick = daemon.tick()

    assert tick.data.run_requests == []
    assert [run.tags["dagster/run_key"] for run in daemon.instance.get_runs()] == [first.run_key]


def test_a_revert_after_the_night_landed_another_version_is_started(
    inbox: Path, daemon: SensorDaemon
) -> None:
    # The night built A, which the sensor then saw (no run: built); the file became B, which the
    # night landed and built without the sensor seeing it; then A came back. The cursor still
    # says A, the partition's newest is B: A is a change, and its run lands it as the newest
    # version again (A -> B -> A), though no run of the sensor ever read A.
    path = put(inbox / DAY / "seeds.jsonl", '{"prompt": "A"}\n', age_s=90)
    _night(inbox)
    daemon.tick()
    put(path, '{"prompt": "B"}\n', age_s=60)
    _night(inbox)
    put(path, '{"prompt": "A"}\n', age_s=30)

    tick = daemon.tick()

    sha_a = file_sha256(path)
    assert tick.run_keys == [f"{DAY}/seeds.jsonl:{sha_a[:16]}:landed-again:1"]
    (result,) = tick.results
    assert result.success
    with Landing(StatePaths(home=inbox.parent)) as landing:
        current = landing.current(DAY, "seeds")
    assert current is not None
    assert current.sha256 == sha_a


def test_the_same_bytes_dropped_again_start_nothing(inbox: Path, daemon: SensorDaemon) -> None:
    path = put(inbox / DAY / "seeds.jsonl", age_s=90)
    (first,) = daemon.tick().launched
    path.unlink()
    assert daemon.tick().data.run_requests == []  # gone: the partition keeps its snapshot
    put(path, age_s=30)  # the same name and bytes again, a new mtime and inode

    again = daemon.tick()

    assert again.launched == []
    assert len(daemon.instance.get_run_records()) == 1
    assert first.run_key is not None
