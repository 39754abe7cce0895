"""Who runs the API's batches: the daemon when one serves the instance, else `kimi-batch api`."""

from __future__ import annotations

import json
import os
import signal
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

from kimi_batch.batch_api import ApiStore, BatchRecord, BatchStatus, validate_batch
from kimi_batch.batch_api.web.runs import (
    LAUNCH_FAILED_CODE,
    LAUNCHED_BY_TAG,
    NO_RUNNER_CODE,
    SENSOR_DAEMON,
    BatchRuns,
    RunMode,
)
from kimi_batch.batch_api.web.server import runner_text
from kimi_batch.defs.assets.api_batch import API_TRIGGER_TAG
from kimi_batch.settings import Settings
from kimi_batch_tests.support.batches import chat_line, jsonl
from kimi_batch_tests.support.llama_server import LlamaEnv
from kimi_batch_tests.support.ports import free_port
from kimi_batch_tests.support.postgres import StateBackend

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
        deadline = time.monotonic() + BATCH_TIMEOUT_S
        while batch.status not in ("completed", "failed", "cancelled", "expired"):
            assert time.monotonic() < deadline, (
                f"{batch.id} still {batch.status}: {log.read_text()}"
            )
            time.sleep(0.5)
            batch = client.batches.retrieve(batch.id)
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
