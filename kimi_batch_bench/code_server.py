"""One long-lived code server for a daemon (and a webserver) started on their own.

`dagster-daemon run -w workspace.yaml` serves the code location from code servers it starts
itself, and it reloads its workspace every 60 s (Dagster's `RELOAD_WORKSPACE_INTERVAL`, not
configurable), starting a fresh `dagster api grpc` each time: on the night bench those respawns
were half of the orchestration's CPU. `serving_code_location` starts `dagster code-server start`
once on a free loopback port instead (its own process group, stopped on exit) and hands back the
environment that points `workspace.code-server.yaml` at it; the daemon's reload then only reads
the location's snapshot from that server. Runs are launched through it too (the run launcher asks
the code server to start each run's worker, as with the daemon's own servers), and the UI's
"Reload" restarts the code inside it.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from kimi_batch_bench.children import start_group, stop_group
from kimi_batch_bench.errors import BenchError
from kimi_batch_bench.ports import free_port

__all__ = [
    "CODE_SERVER_WORKSPACE",
    "LOCATION_NAME",
    "PORT_VARIABLE",
    "code_server_argv",
    "serving_code_location",
]

_REPO = Path(__file__).resolve().parents[1]
# The grpc_server location the daemon and webserver attach to; its port comes from PORT_VARIABLE,
# which `dagster code-server start` reads as well.
CODE_SERVER_WORKSPACE = _REPO / "workspace.code-server.yaml"
PORT_VARIABLE = "DAGSTER_CODE_SERVER_PORT"
LOCATION_NAME = "kimi_batch"
HOST = "127.0.0.1"
# The server listens once its child has imported the code location: ~20 s on 2 busy cores.
STARTUP_TIMEOUT_S = 240.0


def code_server_argv(module: str = "kimi_batch.definitions") -> list[str]:
    """`dagster code-server start` for `module` on HOST (the port from PORT_VARIABLE)."""
    dagster = Path(sys.executable).parent / "dagster"
    return [
        str(dagster),
        *("code-server", "start", "-m", module, "-h", HOST),
        *("--location-name", LOCATION_NAME),
    ]


def _listening(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=1.0):
            return True
    except OSError:
        return False


def _wait_listening(
    process: subprocess.Popen[bytes], port: int, log: Path, timeout_s: float
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise BenchError(f"the code server exited with {process.returncode}:\n{tail}")
        if _listening(port):
            return
        time.sleep(0.5)
    raise BenchError(f"the code server did not listen on {HOST}:{port} in {timeout_s:.0f} s")


@contextmanager
def serving_code_location(
    env: Mapping[str, str], *, cwd: Path, log: Path, timeout_s: float = STARTUP_TIMEOUT_S
) -> Iterator[dict[str, str]]:
    """A code server for `kimi_batch.definitions` with `env`, up until the exit; yields `env`
    plus the port, for the processes that load `CODE_SERVER_WORKSPACE`."""
    served = {**env, PORT_VARIABLE: str(free_port())}
    process = start_group(code_server_argv(), env=served, cwd=cwd, log=log)
    try:
        _wait_listening(process, int(served[PORT_VARIABLE]), log, timeout_s)
        yield served
    finally:
        stop_group(process)
