"""A night bench stopped with SIGTERM leaves nothing running: not its llama-server, not the
`dagster-daemon`, not the daemon's code server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kimi_batch_tests.support.ports import free_port

STARTUP_S = 240.0


def _processes_of(home: Path, *, besides: int) -> dict[int, str]:
    """pid -> command line of every process whose arguments or environment name `home`."""
    marker = str(home).encode()
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == besides:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and (marker in cmdline or marker in environ):
            found[int(entry.name)] = cmdline.replace(b"\0", b" ").decode(errors="replace")
    return found


@pytest.mark.slow
def test_sigterm_stops_the_server_the_daemon_and_its_code_server(
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
        # Up: the server, the daemon and the daemon's own child (its code server).
        while time.monotonic() < deadline and bench.poll() is None:
            children = _processes_of(home, besides=bench.pid)
            commands = " ".join(children.values())
            if "llama-server" in commands and "dagster-daemon" in commands and len(children) >= 4:
                break
            time.sleep(0.5)
        assert bench.poll() is None, "the bench ended before its children were up"
        assert "llama-server" in " ".join(children.values())
        assert "dagster-daemon" in " ".join(children.values())

        bench.send_signal(signal.SIGTERM)
        assert bench.wait(timeout=120) == 128 + signal.SIGTERM
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()

    left = _processes_of(home, besides=bench.pid)
    assert left == {}, left
