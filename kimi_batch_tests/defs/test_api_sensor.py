"""The API batch sensor: a landed batch gets its partition and one run at once; nothing else does."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

import kimi_batch.batch_api.lifecycle as api_batches
from kimi_batch.batch_api import (
    MAX_FINISH_ATTEMPTS,
    MAX_VALIDATION_ATTEMPTS,
    ApiStore,
    BatchRecord,
    BatchStatus,
    validate_batch,
)
from kimi_batch.crash_points import CrashPointReached, armed
from kimi_batch.defs.api_sensor import build_api_batch_sensor
from kimi_batch.defs.assets.api_batch import API_TRIGGER_TAG
from kimi_batch.engine import Ledger
from kimi_batch.settings import Settings
from kimi_batch_tests.support.postgres import StateBackend
from kimi_batch_tests.support.results import make_result

# Above the kernel's largest pid_max (2**22): never a live process.
DEAD_OWNER = f"{socket.gethostname()}:{(1 << 22) + 7}"


def _batch(
    store: ApiStore,
    settings: Settings,
    *,
    land: bool,
    custom_ids: tuple[str, ...] = ("a",),
    owner: str | None = None,
) -> BatchRecord:
    lines = [
        {
            "custom_id": custom_id,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": "Hi."}]},
        }
        for custom_id in custom_ids
    ]
    data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    batch = store.add_upload_batch(data, owner=owner)
    return validate_batch(settings, store, batch) if land else batch


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path))
    return Settings.from_env()


def _tick(instance: dg.DagsterInstance) -> dg.SensorResult:
    result = build_api_batch_sensor(Settings.from_env())(dg.build_sensor_context(instance=instance))
    assert isinstance(result, dg.SensorResult)
    return result


def test_a_landed_batch_gets_its_partition_and_one_run(settings: Settings) -> None:
    with dg.instance_for_test() as instance:
        assert not _tick(instance).run_requests  # no store yet: nothing to do
        with ApiStore(settings.paths) as store:
            landed = _batch(store, settings, land=True)
            _batch(store, settings, land=False)  # still validating: not yet
            cancelled = _batch(store, settings, land=True)
            store.update_batch(cancelled.id, status=BatchStatus.CANCELLING)
            running = _batch(store, settings, land=True)
            store.update_batch(running.id, status=BatchStatus.IN_PROGRESS, run_id="r1")
        result = _tick(instance)
        requests = result.run_requests or []
        # The cancelled one runs too: its run finishes it as cancelled at once.
        assert {r.partition_key for r in requests} == {landed.id, cancelled.id}
        assert {r.run_key for r in requests} == {f"api:{landed.id}", f"api:{cancelled.id}"}
        assert all(r.tags[API_TRIGGER_TAG] for r in requests)
        [added] = result.dynamic_partitions_requests or []
        assert isinstance(added, dg.AddDynamicPartitionsRequest)
        assert set(added.partition_keys) == {landed.id, cancelled.id}


def _run(
    instance: dg.DagsterInstance,
    status: dg.DagsterRunStatus,
    tags: dict[str, str] | None = None,
) -> dg.DagsterRun:
    return instance.add_run(dg.DagsterRun(job_name="api_batch_job", status=status, tags=tags))


def _after_a_tick(
    instance: dg.DagsterInstance, settings: Settings, batch_id: str
) -> tuple[BatchRecord, list[dict[str, Any]], list[dict[str, Any]]]:
    """The batch after one sensor tick, with its output and error file lines."""
    _tick(instance)
    with ApiStore(settings.paths) as store:
        record = store.batch(batch_id)
        assert record is not None
        ids = (record.output_file_id, record.error_file_id)
        files = [store.file(file_id) if file_id else None for file_id in ids]
        output, errors = (
            [json.loads(line) for line in store.blob_path(f).read_text().splitlines()] if f else []
            for f in files
        )
    return record, output, errors


def _taken_up(store: ApiStore, settings: Settings, run: dg.DagsterRun) -> BatchRecord:
    """A batch of two requests whose run answered one ("a") before it died."""
    batch = _batch(store, settings, land=True, custom_ids=("a", "b"))
    store.set_request_keys(batch.id, [("a", "key-a"), ("b", "key-b")])
    with Ledger(settings.paths.ledger_state) as ledger:  # the state's own (PostgreSQL too)
        ledger.put(make_result("the answer", request_id="key-a", input_id="a"))
    return store.update_batch(batch.id, status=BatchStatus.IN_PROGRESS, run_id=run.run_id)


def test_a_batch_whose_run_died_fails_with_the_run_named_and_its_partial_files(
    settings: Settings,
) -> None:
    with dg.instance_for_test() as instance:
        dead = _run(instance, dg.DagsterRunStatus.FAILURE)
        with ApiStore(settings.paths) as store:
            batch = _taken_up(store, settings, dead)
        done, [answered], [unanswered] = _after_a_tick(instance, settings, batch.id)
        assert done.status == BatchStatus.FAILED
        assert done.failed_at is not None
        [error] = done.errors
        assert error.code == "run_failed"
        assert dead.run_id in error.message
        assert answered["custom_id"] == "a"
        assert unanswered["custom_id"] == "b"
        assert unanswered["error"] == {
            "code": "batch_failed",
            "message": "the batch's run failed before this request was answered",
        }


def test_a_cancel_whose_run_died_ends_cancelled(settings: Settings) -> None:
    with dg.instance_for_test() as instance:
        dead = _run(instance, dg.DagsterRunStatus.FAILURE)
        with ApiStore(settings.paths) as store:
            batch = _taken_up(store, settings, dead)
            store.update_batch(batch.id, status=BatchStatus.CANCELLING)
        done, [answered], [unanswered] = _after_a_tick(instance, settings, batch.id)
        assert done.status == BatchStatus.CANCELLED
        assert not done.errors
        assert answered["custom_id"] == "a"
        assert unanswered["error"]["code"] == "batch_cancelled"


def test_a_queued_run_that_failed_before_its_step_fails_the_batch(settings: Settings) -> None:
    with dg.instance_for_test() as instance:
        with ApiStore(settings.paths) as store:
            batch = _batch(store, settings, land=True)
        _run(instance, dg.DagsterRunStatus.FAILURE, tags={API_TRIGGER_TAG: batch.id})
        done, answered, [unanswered] = _after_a_tick(instance, settings, batch.id)
        assert done.status == BatchStatus.FAILED
        assert not answered
        assert unanswered["custom_id"] == "a"


@pytest.mark.parametrize(
    ("status", "tags"),
    [
        (dg.DagsterRunStatus.STARTED, None),
        (dg.DagsterRunStatus.CANCELING, None),
        (dg.DagsterRunStatus.FAILURE, {"dagster/will_retry": "true"}),
    ],
)
def test_a_batch_whose_run_goes_on_is_left_alone(
    settings: Settings, status: dg.DagsterRunStatus, tags: dict[str, str] | None
) -> None:
    with dg.instance_for_test() as instance:
        run = _run(instance, status, tags)
        with ApiStore(settings.paths) as store:
            batch = _taken_up(store, settings, run)
        still, answered, unanswered = _after_a_tick(instance, settings, batch.id)
        assert still.status == BatchStatus.IN_PROGRESS
        assert (answered, unanswered) == ([], [])


def test_what_a_killed_api_left_validating_is_validated_and_run(settings: Settings) -> None:
    with dg.instance_for_test() as instance:
        with ApiStore(settings.paths) as store:
            left = _batch(store, settings, land=False, owner=DEAD_OWNER)
            cancelled = _batch(store, settings, land=False, owner=DEAD_OWNER)
            store.update_batch(cancelled.id, status=BatchStatus.CANCELLING)
            live = _batch(store, settings, land=False)  # this (live) process validates it
        requests = _tick(instance).run_requests or []
        assert [r.partition_key for r in requests] == [left.id]
        with ApiStore(settings.paths) as store:
            landed, gone, waiting = (store.batch(b.id) for b in (left, cancelled, live))
        assert landed is not None
        assert gone is not None
        assert waiting is not None
        assert landed.input_sha256 is not None
        assert landed.request_total == 1
        assert gone.status == BatchStatus.CANCELLED
        assert waiting.input_sha256 is None


def test_a_validation_interrupted_too_often_fails_the_batch(settings: Settings) -> None:
    with dg.instance_for_test() as instance:
        with ApiStore(settings.paths) as store:
            batch = _batch(store, settings, land=False, owner=DEAD_OWNER)
            for _ in range(MAX_VALIDATION_ATTEMPTS):
                store.claim_validation(batch.id, DEAD_OWNER)  # each one killed midway
        assert not _tick(instance).run_requests
        with ApiStore(settings.paths) as store:
            failed = store.batch(batch.id)
        assert failed is not None
        assert failed.status == BatchStatus.FAILED
        [error] = failed.errors
        assert error.code == "validation_interrupted"


# ---- a finish killed while it writes the files ----------------------------------------------


@pytest.fixture
def backend_settings(state_backend: StateBackend, monkeypatch: pytest.MonkeyPatch) -> Settings:
    state_backend.apply(monkeypatch)
    return Settings.from_env()


def _killed_writing(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make every write of a batch's files die as a process killed for memory would; the
    batch ids it was tried for."""
    tried: list[str] = []

    def killed(store: ApiStore, ledger: Ledger, batch: BatchRecord, *args: Any, **kw: Any) -> Any:
        tried.append(batch.id)
        raise MemoryError("killed while writing the output file")

    monkeypatch.setattr(api_batches, "write_batch_files", killed)
    return tried


def test_a_finish_killed_every_time_is_not_retried_on_every_tick(
    backend_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = backend_settings
    with dg.instance_for_test() as instance:
        dead = _run(instance, dg.DagsterRunStatus.FAILURE)
        with ApiStore(settings.paths) as store:
            batch = _taken_up(store, settings, dead)
        tried = _killed_writing(monkeypatch)
        for _ in range(MAX_FINISH_ATTEMPTS):
            with pytest.raises(MemoryError):
                _tick(instance)
        done, output, errors = _after_a_tick(instance, settings, batch.id)
        for _ in range(3):  # later ticks leave it alone
            _tick(instance)
        assert tried == [batch.id] * MAX_FINISH_ATTEMPTS  # the tick after them writes nothing
        assert done.status == BatchStatus.FAILED
        assert (output, errors) == ([], [])
        assert [error.code for error in done.errors] == ["run_failed", "finish_failed"]
        assert f"stopped {MAX_FINISH_ATTEMPTS} times" in done.errors[1].message


def test_a_finish_killed_once_is_done_whole_by_the_next_tick(
    backend_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = backend_settings
    with dg.instance_for_test() as instance:
        dead = _run(instance, dg.DagsterRunStatus.FAILURE)
        with ApiStore(settings.paths) as store:
            batch = _taken_up(store, settings, dead)
        with monkeypatch.context() as patched:
            _killed_writing(patched)
            with pytest.raises(MemoryError):
                _tick(instance)
        done, [answered], [unanswered] = _after_a_tick(instance, settings, batch.id)
        assert done.status == BatchStatus.FAILED
        assert [error.code for error in done.errors] == ["run_failed"]  # named once
        assert (answered["custom_id"], unanswered["custom_id"]) == ("a", "b")
        with ApiStore(settings.paths) as store:
            temps = [p.name for p in store.files_dir.iterdir() if p.name.startswith(".")]
        assert temps == []  # what the killed write staged is gone


def test_a_crash_after_counting_a_finish_attempt_is_finished_by_the_next_tick(
    backend_settings: Settings,
) -> None:
    settings = backend_settings
    with dg.instance_for_test() as instance:
        dead = _run(instance, dg.DagsterRunStatus.FAILURE)
        with ApiStore(settings.paths) as store:
            batch = _taken_up(store, settings, dead)
        with armed("api.finish_attempt"), pytest.raises(CrashPointReached):
            _tick(instance)
        done, [answered], [unanswered] = _after_a_tick(instance, settings, batch.id)
    assert done.status == BatchStatus.FAILED
    assert (answered["custom_id"], unanswered["custom_id"]) == ("a", "b")


def test_a_batch_whose_run_the_api_started_gets_no_second_run(settings: Settings) -> None:
    """`kimi-batch api` started its run (no daemon then): a daemon starting later leaves it."""
    with dg.instance_for_test() as instance, ApiStore(settings.paths) as store:
        started = _batch(store, settings, land=True)
        waiting = _batch(store, settings, land=True)
        _run(instance, dg.DagsterRunStatus.STARTED, {API_TRIGGER_TAG: started.id})
        requests = _tick(instance).run_requests or []
        assert [request.partition_key for request in requests] == [waiting.id]
