"""`kimi-batch status` against the homes a deployment has, without a llama-server: the Dagster
instance of `DAGSTER_HOME`, a fresh home that prints nothing of Dagster's, a server on the port
that another state dir started, and this home's server started with another spec."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import dagster as dg
import pytest

from kimi_batch.cli.commands import main
from kimi_batch.cli.status import collect_status
from kimi_batch.defs.partitions import DATE_DIMENSION, SOURCE_DIMENSION, build_batch_partitions
from kimi_batch.inputs.landing import Landing
from kimi_batch.llama import ResidentServer, server_from_settings
from kimi_batch.llama.process import PidRecord, process_start_ticks
from kimi_batch.settings import Settings
from kimi_batch_tests.support.ports import free_port
from kimi_batch_tests.support.repo import REPO_ROOT
from kimi_batch_tests.support.server_standin import standing_in_for_the_server

pytestmark = pytest.mark.filterwarnings("ignore:Non-compliant tag keys:DeprecationWarning")

CLI = Path(sys.executable).parent / "kimi-batch"
DAY = (datetime.now(UTC).date() - timedelta(days=3)).isoformat()


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh state dir, the default configuration, no llama-server on a free port."""
    for name in list(os.environ):
        if name.startswith("KIMI_BATCH_") or name == "DAGSTER_HOME":
            monkeypatch.delenv(name)
    home = tmp_path / "home"
    monkeypatch.setenv("KIMI_BATCH_HOME", str(home))
    monkeypatch.setenv("KIMI_BATCH_LLAMA_PORT", str(free_port()))
    monkeypatch.setenv("KIMI_BATCH_PARTITIONS_START", "2025-01-01")
    return home


def _status_cli(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CLI), "status", "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=300,
        check=False,
    )


def test_status_reads_the_instance_dagster_home_names(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deployment's instance lives where DAGSTER_HOME says, not under the state dir."""
    instance_dir = tmp_path / "srv" / "dagster"
    instance_dir.mkdir(parents=True)
    shutil.copy(REPO_ROOT / "dagster.yaml", instance_dir / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(instance_dir))
    settings = Settings.from_env()
    inbox = settings.paths.inbox_dir / DAY
    inbox.mkdir(parents=True)
    (inbox / "web.jsonl").write_text('{"prompt": "status?"}\n')
    with Landing(settings.paths) as landing:
        landing.assign_inbox(
            settings.paths.inbox_dir,
            arrived=settings.today(),
            start=settings.first_partition_date(),
        )

    @dg.asset(name="distilled_responses", partitions_def=build_batch_partitions(settings))
    def failing() -> None:
        raise RuntimeError("stand-in failure")

    key = dg.MultiPartitionKey({DATE_DIMENSION: DAY, SOURCE_DIMENSION: "web"})
    with dg.DagsterInstance.from_config(str(instance_dir)) as instance:
        instance.add_dynamic_partitions("source", ["web"])
        dg.materialize([failing], partition_key=key, instance=instance, raise_on_error=False)

    status = collect_status(settings)

    assert status.partitions.dagster_home == str(instance_dir)
    assert status.partitions.error is None
    assert status.partitions.failed == 1
    assert status.partitions.keys == {"failed": [str(key)]}
    assert not settings.paths.dagster_home.exists()


@pytest.mark.parametrize("history", [False, True], ids=["fresh", "history-without-yaml"])
def test_a_dagster_home_without_dagster_yaml_prints_nothing_of_dagsters(
    home: Path, history: bool
) -> None:
    """`make dev`'s layout before anything ran: DAGSTER_HOME is the state dir's folder."""
    instance_dir = home / "dagster"
    instance_dir.mkdir(parents=True)
    if history:
        dg.DagsterInstance.from_config(str(instance_dir)).dispose()  # storage, no dagster.yaml
    before = sorted(path.name for path in instance_dir.rglob("*"))

    result = _status_cli({"DAGSTER_HOME": str(instance_dir)})

    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    status = json.loads(result.stdout)
    assert (status["partitions"]["dagster_home"] is not None) == history
    assert sorted(path.name for path in instance_dir.rglob("*")) == before  # nothing written


class _OtherHomesServer(BaseHTTPRequestHandler):
    """What a llama-server another state dir started answers."""

    def do_GET(self) -> None:
        body = {
            "/health": {"status": "ok"},
            "/props": {"model_path": "/elsewhere/other-model.gguf", "total_slots": 3},
            "/slots": [],
        }.get(self.path)
        payload = json.dumps(body).encode()
        self.send_response(200 if body is not None else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: object) -> None:
        return


@pytest.fixture
def other_homes_server(home: Path) -> Iterator[int]:
    port = int(os.environ["KIMI_BATCH_LLAMA_PORT"])
    server = ThreadingHTTPServer(("127.0.0.1", port), _OtherHomesServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield port
    finally:
        server.shutdown()
        server.server_close()


def test_a_server_another_state_dir_started_is_not_this_homes(
    home: Path, other_homes_server: int
) -> None:
    status = collect_status(Settings.from_env())

    assert status.server.running is False
    assert status.server.healthy is False
    assert status.server.pid is None
    assert status.server.model is None
    assert status.server.error is not None
    assert status.server.error.startswith(
        f"another llama-server answers at http://127.0.0.1:{other_homes_server}, not started "
        "from this state dir"
    )


def test_this_homes_server_started_with_another_spec_is_not_called_healthy(home: Path) -> None:
    """The pid file names a live process (this test's own, standing in for the server) whose
    recorded spec is not what the configuration asks: a run would refuse it."""
    settings = Settings.from_env()
    manager = server_from_settings(settings)
    assert isinstance(manager, ResidentServer)
    manager.state_dir.mkdir(parents=True)
    running = manager.spec.model_copy(update={"parallel": manager.spec.parallel + 1})
    manager.spec_path.write_text(running.model_dump_json())
    ticks = process_start_ticks(os.getpid())
    assert ticks is not None
    record = PidRecord(pid=os.getpid(), start_ticks=ticks, started_at=time.time())
    manager.pid_path.write_text(record.model_dump_json())

    status = collect_status(settings)

    assert status.server.running is True
    assert status.server.pid == os.getpid()
    assert status.server.healthy is False
    assert status.server.error is not None
    assert "runs another spec than this configuration asks" in status.server.error
    assert f"slots={running.parallel}" in status.server.error


def test_status_and_stop_reach_this_homes_server_when_its_model_is_gone(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by audit: with KIMI_BATCH_MODEL naming a file not there (yet), `status` and
    `server status` printed only "model file not found" and `server stop` could not stop the
    server this state dir runs; both still say what a start would fail on. A sleeping process
    stands in for the server."""
    with standing_in_for_the_server(Settings.from_env()) as stand_in:
        monkeypatch.setenv("KIMI_BATCH_MODEL", str(home / "models" / "kimi-k2.5.gguf"))

        status = collect_status(Settings.from_env())
        assert status.server.running is True
        assert status.server.pid == stand_in.pid
        assert status.server.error is not None  # and what the next start would fail on
        assert status.server.error.startswith("model file not found: ")
        assert main(["server", "status", "--json"]) == 0
        printed = capsys.readouterr()
        assert json.loads(printed.out)["pid"] == stand_in.pid
        assert printed.err.startswith("kimi-batch: warning: a start would fail: model file not")

        assert main(["server", "stop"]) == 0
        assert capsys.readouterr().out == "stopped llama-server\n"
        assert stand_in.wait(timeout=30) != 0
        assert not (home / "server" / "server.pid").exists()


def test_status_and_stop_reach_this_home_when_its_configured_cpus_are_gone(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by review: the watched server's spec still checked KIMI_BATCH_LLAMA_CPUS, so on a
    machine offering fewer CPUs than configured `status` and `server stop` raised."""
    monkeypatch.setenv("KIMI_BATCH_LLAMA_CPUS", "0-999")

    status = collect_status(Settings.from_env())

    assert status.server.running is False
    assert status.server.error is not None
    assert "999" in status.server.error
    assert main(["server", "stop"]) == 0
    assert capsys.readouterr().out == "no llama-server was running\n"
