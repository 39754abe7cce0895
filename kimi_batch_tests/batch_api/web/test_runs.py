"""Who runs the API's batches: the daemon when one serves the instance, else `kimi-batch api`."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
import httpx
import pytest
from dagster._daemon.types import DaemonHeartbeat
from openai import OpenAI
from openai.types import Batch

from kimi_batch.batch_api import (
    ApiStore,
    BatchRecord,
    BatchStatus,
    begin_batch,
    process_token,
    validate_batch,
)
from kimi_batch.batch_api.web.runs import (
    LAUNCH_FAILED_CODE,
    LAUNCHED_BY,
    LAUNCHED_BY_TAG,
    NO_RUNNER_CODE,
    RUN_WORKER_TAG,
    SENSOR_DAEMON,
    BatchRuns,
    RunMode,
)
from kimi_batch.batch_api.web.server import runner_text
from kimi_batch.defs.assets.api_batch import API_TRIGGER_TAG
from kimi_batch.defs.assets.stage_asset import LLAMA_POOL
from kimi_batch.defs.jobs import API_BATCH_JOB_NAME
from kimi_batch.settings import Settings
from kimi_batch_tests.support.batches import chat_line, jsonl
from kimi_batch_tests.support.llama_server import LlamaEnv
from kimi_batch_tests.support.ports import free_port
from kimi_batch_tests.support.postgres import StateBackend
from kimi_batch_tests.support.processes import descendants

RUN_TIMEOUT_S = 240.0
BATCH_TIMEOUT_S = 600.0


@pytest.fixture
def settings(
    state_backend: StateBackend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Settings:
    state_backend.apply(monkeypatch)
    home = tmp_path / "dagster"
    home.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    return Settings.from_env()


def _landed(settings: Settings, store: ApiStore) -> BatchRecord:
    line = {
        "custom_id": "a",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"messages": [{"role": "user", "content": "Hi."}]},
    }
    batch = store.add_upload_batch(json.dumps(line).encode() + b"\n")
    return validate_batch(settings, store, batch)


def _beat(instance: dg.DagsterInstance, at: float) -> None:
    instance.add_daemon_heartbeat(
        DaemonHeartbeat(timestamp=at, daemon_type=SENSOR_DAEMON, daemon_id="d", errors=[])
    )


def test_a_fresh_sensor_heartbeat_leaves_the_batches_to_the_daemon(settings: Settings) -> None:
    runs = BatchRuns(settings)
    home = str(runs.instance.root_directory)
    assert runs.mode() is RunMode.OWN
    assert "this process runs the batches" in runner_text(runs.mode(), home)
    assert BatchRuns(settings, launch=False).mode() is RunMode.NONE
    _beat(runs.instance, time.time() - 200)  # a daemon stopped minutes ago serves nothing
    assert runs.mode() is RunMode.OWN
    _beat(runs.instance, time.time())
    with ApiStore(settings.paths) as store:
        _landed(settings, store)
    assert runs.tick() is RunMode.DAEMON
    assert "Dagster daemon serving" in runner_text(RunMode.DAEMON, home)
    assert not runs.instance.get_runs()  # the daemon's sensor starts it, not this process


def test_with_nobody_to_run_it_a_batch_says_why_after_a_minute(settings: Settings) -> None:
    runs = BatchRuns(settings, launch=False)
    with ApiStore(settings.paths) as store:
        fresh = _landed(settings, store)
        old = _landed(settings, store)
        store.update_batch(old.id, created_at=int(time.time()) - 61)
    assert runs.tick() is RunMode.NONE
    runs.tick()  # said once
    with ApiStore(settings.paths) as store:
        waited, young = store.batch(old.id), store.batch(fresh.id)
    assert waited is not None
    assert young is not None
    assert [error.code for error in waited.errors] == [NO_RUNNER_CODE]
    assert "no Dagster daemon" in waited.errors[0].message
    assert "--no-launch" in waited.errors[0].message
    assert waited.status is BatchStatus.VALIDATING
    assert not young.errors


def test_without_a_daemon_a_cancel_completes_through_a_run_started_here(
    settings: Settings,
) -> None:
    """A batch cancelled before its run: the API starts the run itself, which ends it."""
    runs = BatchRuns(settings)
    with ApiStore(settings.paths) as store:
        batch = _landed(settings, store)
        store.update_batch(batch.id, status=BatchStatus.CANCELLING)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    record = batch
    while time.monotonic() < deadline:
        assert runs.tick() is RunMode.OWN
        with ApiStore(settings.paths) as store:
            record = store.batch(batch.id) or batch
        if record.terminal and all(run.is_finished for run in runs.instance.get_runs()):
            break
        time.sleep(1)
    assert record.status is BatchStatus.CANCELLED
    [run] = runs.instance.get_runs()
    assert run.job_name == "api_batch_job"
    assert run.status is dg.DagsterRunStatus.CANCELED  # as with the daemon: the run ends cancelled
    assert run.tags["dagster/partition"] == batch.id
    assert run.tags[API_TRIGGER_TAG] == batch.id
    assert run.tags[LAUNCHED_BY_TAG] == "kimi-batch api"
    runs.tick()  # the batch is final: no second run
    assert len(runs.instance.get_runs()) == 1


def test_a_run_that_cannot_start_is_tried_three_times_then_said(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child that dies before creating its run (here: no Python at all) is not restarted
    every tick for ever: after three tries the batch's errors say so."""
    monkeypatch.setattr(sys, "executable", "/bin/false")
    runs = BatchRuns(settings)
    with ApiStore(settings.paths) as store:
        batch = _landed(settings, store)
    deadline = time.monotonic() + 60
    record = batch
    while not record.errors:
        assert time.monotonic() < deadline
        runs.tick()
        time.sleep(0.2)
        with ApiStore(settings.paths) as store:
            record = store.batch(batch.id) or batch
    assert [error.code for error in record.errors] == [LAUNCH_FAILED_CODE]
    assert "failed to start 3 times" in record.errors[0].message
    assert record.status is BatchStatus.VALIDATING  # a daemon may still run it
    assert not runs.instance.get_runs()
    log = Path(str(runs.instance.root_directory)) / "kimi-batch-api-runs.log"
    assert log.exists()


def _started_run(instance: dg.DagsterInstance, batch_id: str, worker: str) -> dg.DagsterRun:
    """A run of the batch as `kimi-batch api`'s child records it, executing its step in the
    llama pool, its worker `worker` (a `process_token`)."""
    run = dg.DagsterRun(
        job_name=API_BATCH_JOB_NAME,
        status=dg.DagsterRunStatus.STARTED,
        tags={
            "dagster/partition": batch_id,
            API_TRIGGER_TAG: batch_id,
            LAUNCHED_BY_TAG: LAUNCHED_BY,
            RUN_WORKER_TAG: f"{socket.gethostname()}:{worker}",
        },
    )
    instance.add_run(run)
    storage = instance.event_log_storage
    storage.set_concurrency_slots(LLAMA_POOL, 1)
    storage.claim_concurrency_slot(LLAMA_POOL, run.run_id, "api_batch_responses")
    return run


def test_a_run_whose_worker_was_killed_fails_its_batch_and_frees_its_slot(
    settings: Settings,
) -> None:
    """No daemon, the child running a batch killed (-9, out of memory): nothing would end its
    run, the batch would say in_progress for ever and the next run wait for the pool's slot.
    The next tick ends the run and the batch fails; a run whose worker lives is left alone."""
    runs = BatchRuns(settings)
    with subprocess.Popen(["true"]) as killed:
        killed.wait()
    with ApiStore(settings.paths) as store:
        batch = _landed(settings, store)
        dead = _started_run(runs.instance, batch.id, process_token(killed.pid))
        assert begin_batch(store, batch.id, run_id=dead.run_id, by_hand=False)
        other = _landed(settings, store)
        alive = _started_run(runs.instance, other.id, process_token())
    storage = runs.instance.event_log_storage
    assert storage.get_concurrency_run_ids() == {dead.run_id, alive.run_id}

    runs.tick()

    assert runs.instance.get_run_by_id(dead.run_id).status is dg.DagsterRunStatus.FAILURE  # pyright: ignore[reportOptionalMemberAccess]
    assert runs.instance.get_run_by_id(alive.run_id).status is dg.DagsterRunStatus.STARTED  # pyright: ignore[reportOptionalMemberAccess]
    assert storage.get_concurrency_run_ids() == {alive.run_id}
    with ApiStore(settings.paths) as store:
        failed = store.batch(batch.id)
    assert failed is not None
    assert failed.status is BatchStatus.FAILED
    assert [error.code for error in failed.errors] == ["run_failed"]
    assert dead.run_id in failed.errors[0].message


@contextmanager
def _api_command(env: dict[str, str], log: Path) -> Iterator[str]:
    """`kimi-batch api` as a user starts it, on a free port: its base URL while the block runs."""
    port = free_port()
    argv = [sys.executable, "-m", "kimi_batch.cli", "api", "--port", str(port)]
    with log.open("w") as sink:
        process = subprocess.Popen(argv, env=env, stdout=sink, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, log.read_text()
            try:
                httpx.get(f"{url}/files", timeout=2)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
        yield url
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _until_final(client: OpenAI, batch: Batch, timeout_s: float, log: Path) -> Batch:
    """The batch polled until its status is final; the API's log tells why one never was."""
    deadline = time.monotonic() + timeout_s
    while batch.status not in ("completed", "failed", "cancelled", "expired"):
        assert time.monotonic() < deadline, f"{batch.id} still {batch.status}: {log.read_text()}"
        time.sleep(0.5)
        batch = client.batches.retrieve(batch.id)
    return batch


@pytest.mark.slow
def test_the_readmes_ten_lines_complete_a_batch_with_no_daemon(
    llama_env: LlamaEnv, tmp_path: Path
) -> None:
    """Only the resident server (`kimi-batch server start`) and `kimi-batch api`: no Dagster
    daemon, no DAGSTER_HOME. The README's lines, with the official client, get their answers."""
    env = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_HOME", "KIMI_BATCH_API_KEY")}
    requests = tmp_path / "requests.jsonl"
    requests.write_bytes(jsonl(chat_line("a", "Name a color."), chat_line("b", "Say hi.")))
    log = tmp_path / "api.log"
    with _api_command(env, log) as url:
        key = (llama_env.home / "api" / "key").read_text().strip()
        # The README's lines.
        client = OpenAI(base_url=url, api_key=key)
        upload = client.files.create(file=requests.open("rb"), purpose="batch")
        batch = client.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        batch = _until_final(client, batch, BATCH_TIMEOUT_S, log)
        assert batch.status == "completed", batch
        assert batch.output_file_id is not None
        lines = [
            json.loads(line)
            for line in client.files.content(batch.output_file_id).text.splitlines()
        ]
    assert sorted(line["custom_id"] for line in lines) == ["a", "b"]
    assert all(line["response"]["status_code"] == 200 for line in lines)
    assert "this process runs the batches itself" in log.read_text()
    with dg.DagsterInstance.from_config(str(llama_env.home / "dagster")) as instance:
        [run] = instance.get_runs(filters=dg.RunsFilter(tags={API_TRIGGER_TAG: batch.id}))
        assert run.status is dg.DagsterRunStatus.SUCCESS
        assert run.tags[LAUNCHED_BY_TAG] == "kimi-batch api"
        assert run.tags["dagster/partition"] == batch.id


@pytest.mark.slow
def test_a_run_killed_hard_with_no_daemon_fails_its_batch_with_the_partial_output(
    llama_env: LlamaEnv, tmp_path: Path
) -> None:
    """SIGKILL of the run `kimi-batch api` started itself (no daemon, so no run monitoring):
    the API ends the run and the batch fails with what was answered, not in_progress for ever."""
    env = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_HOME", "KIMI_BATCH_API_KEY")}
    topics = ("rivers", "mountains", "deserts", "oceans")
    # One short answer lands at once while the others still generate (4 requests, 4 slots).
    lines = [
        chat_line(f"k-{i}", f"Write a long, detailed essay about {topic} (own run killed).",
                  max_tokens=8 if i == 0 else 128, temperature=0.8, seed=i)
        for i, topic in enumerate(topics)
    ]  # fmt: skip
    requests = tmp_path / "requests.jsonl"
    requests.write_bytes(jsonl(*lines))
    log = tmp_path / "api.log"
    with _api_command(env, log) as url:
        key = (llama_env.home / "api" / "key").read_text().strip()
        client = OpenAI(base_url=url, api_key=key, max_retries=0)
        upload = client.files.create(file=requests.open("rb"), purpose="batch")
        batch = client.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        deadline = time.monotonic() + BATCH_TIMEOUT_S
        while not (batch.request_counts and batch.request_counts.completed):
            assert time.monotonic() < deadline, batch
            assert batch.status not in ("completed", "failed", "cancelled", "expired"), batch
            time.sleep(0.2)
            batch = client.batches.retrieve(batch.id)
        with dg.DagsterInstance.from_config(str(llama_env.home / "dagster")) as instance:
            [run] = instance.get_runs(filters=dg.RunsFilter(tags={API_TRIGGER_TAG: batch.id}))
        worker = int(run.tags[RUN_WORKER_TAG].rpartition(":")[2].partition(".")[0])
        for pid in [*descendants(worker), worker]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        batch = _until_final(client, batch, RUN_TIMEOUT_S, log)
        assert batch.status == "failed", batch
        assert batch.errors is not None
        assert [error.code for error in batch.errors.data or []] == ["run_failed"]
        answered = client.files.content(batch.output_file_id or "").text.splitlines()
        assert batch.error_file_id is not None
        unanswered = [
            json.loads(line) for line in client.files.content(batch.error_file_id).text.splitlines()
        ]
    assert 1 <= len(answered) < len(lines)
    assert len(answered) + len(unanswered) == len(lines)
    assert {line["error"]["code"] for line in unanswered} == {"batch_failed"}
    with dg.DagsterInstance.from_config(str(llama_env.home / "dagster")) as instance:
        ended = instance.get_run_by_id(run.run_id)
    assert ended is not None
    assert ended.status is dg.DagsterRunStatus.FAILURE
