"""A night bench stopped with SIGTERM leaves nothing running: not its llama-server, not the
`dagster-daemon`, not the code server the daemon is attached to."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kimi_batch_tests.support.ports import free_port
from kimi_batch_tests.support.processes import processes_naming

STARTUP_S = 240.0


@pytest.mark.slow
def test_sigterm_stops_the_server_the_daemon_and_the_code_server(
    tmp_path: Path, llama_binary: Path, model_path: Path
) -> None:
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KIMI_BATCH_", "DAGSTER_"))}
    env.update(
        {
            "KIMI_BATCH_HOME": str(home),
            "KIMI_BATCH_MODEL": str(model_path),
            "KIMI_BATCH_LLAMA_SERVER": str(llama_binary),
            "KIMI_BATCH_LLAMA_PORT": str(free_port()),
            "KIMI_BATCH_LLAMA_THREADS": "2",
            "KIMI_BATCH_LLAMA_PARALLEL": "2",
        }
    )
    argv = [sys.executable, "-m", "kimi_batch.cli", "bench", "--workload", "night"]
    sizes = ["--partitions", "1", "--rows-per-partition", "1", "--night-output-tokens", "4"]
    bench = subprocess.Popen([*argv, *sizes], env=env, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + STARTUP_S
        children: dict[int, str] = {}
        # Up: the server, the code server (and the child it serves the code from), the daemon.
        wanted = ("llama-server", "code-server start", "api grpc", "dagster-daemon")
        while time.monotonic() < deadline and bench.poll() is None:
            children = processes_naming(home, besides=bench.pid)
            commands = " ".join(children.values())
            if all(name in commands for name in wanted):
                break
            time.sleep(0.5)
        assert bench.poll() is None, "the bench ended before its children were up"
        commands = " ".join(children.values())
        assert all(name in commands for name in wanted), children

        bench.send_signal(signal.SIGTERM)
        assert bench.wait(timeout=120) == 128 + signal.SIGTERM
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()

    left = processes_naming(home, besides=bench.pid)
    assert left == {}, left
