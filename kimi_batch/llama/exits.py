"""How a llama-server process ended, told in one line: a signal is named, never "exited".

A detached server is re-parented away from whoever started it, so nobody could learn its wait
status: the manager launches it through a small waiter (`WAITER_SOURCE`) that stays its parent,
reaps it and writes an `ExitRecord` next to the pid file. `describe_exit` turns a record (or a
return code) into the message `server start`, the Dagster resource and the smoke test print.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

DURING_LOAD = "during the model load / first computation"
# A SIGILL/SIGSEGV this soon after the model loaded is the binary's own code on this CPU (the first
# computations), not a bug in a long-running server.
CPU_HINT_WINDOW_S = 60.0
CPU_FEATURE_HINT = (
    "a crash this early usually means the binary uses CPU instructions this machine cannot run "
    "(llama.cpp's AMX kernels crash on some Xeons): rebuild with `make setup` (the AMX kernels "
    "are left out unless KIMI_BATCH_LLAMA_AMX=1, which only a llama.cpp with the per-thread tile "
    "fix survives), or set KIMI_BATCH_LLAMA_SERVER to a llama-server that works on this CPU"
)
_CPU_SIGNALS = frozenset({signal.SIGILL, signal.SIGSEGV})

# Run as `python -c WAITER_SOURCE ARGV_JSON LOG EXIT_PATH CPUS_JSON`. The first process forks and exits once
# the server is started (printing its pid, or `error: ...`), so init adopts the waiter and nothing
# lingers under a long-lived caller; the waiter, in a session of its own, is the server's parent:
# it reaps the server at once (no zombie looks alive) and writes how it ended to EXIT_PATH.
WAITER_SOURCE = """\
import json, os, subprocess, sys, time
argv, log, exit_path = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
cpus = json.loads(sys.argv[4]) if len(sys.argv) > 4 else []
read_end, write_end = os.pipe()
if os.fork():
    os.close(write_end)
    chunks = []
    while chunk := os.read(read_end, 4096):
        chunks.append(chunk)
    reply = b"".join(chunks).decode(errors="replace").strip()
    print(reply)
    sys.exit(0 if reply.isdigit() else 1)
os.close(read_end)
os.setsid()
try:
    if cpus:  # inherited by the server from its first thread on
        os.sched_setaffinity(0, cpus)
    with open(log, "ab") as out:
        server = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                  start_new_session=True, close_fds=True, umask=0o077)
except OSError as error:
    os.write(write_end, f"error: {error}".encode())
    os._exit(1)
os.write(write_end, str(server.pid).encode())
os.close(write_end)
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
started = time.time()
code = server.wait()
record = {"pid": server.pid, "returncode": code, "started_at": started, "ended_at": time.time()}
tmp = exit_path + f".{os.getpid()}.tmp"
with open(tmp, "w") as out:
    json.dump(record, out)
os.replace(tmp, exit_path)
"""


class ExitRecord(BaseModel):
    """What the waiter saw: the server's pid and its return code (negative: killed by a signal)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pid: int
    returncode: int
    started_at: float
    ended_at: float


def _signal_of(returncode: int) -> signal.Signals | None:
    if returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode)
    except ValueError:
        return None


def signal_name(returncode: int) -> str | None:
    """'SIGSEGV' for a return code of -11; None for an ordinary exit."""
    if returncode >= 0:
        return None
    found = _signal_of(returncode)
    return found.name if found else f"signal {-returncode}"


def read_exit_record(path: Path, pid: int) -> ExitRecord | None:
    """The record of `pid` if the waiter wrote one (a record of another pid is not ours)."""
    try:
        record = ExitRecord.model_validate_json(path.read_text())
    except (OSError, ValidationError):
        return None
    return record if record.pid == pid else None


def wait_for_exit_record(path: Path, pid: int, *, timeout_s: float = 2.0) -> ExitRecord | None:
    """The waiter writes the record right after it reaps the server: give it that moment."""
    deadline = time.monotonic() + timeout_s
    while True:
        record = read_exit_record(path, pid)
        if record is not None or time.monotonic() > deadline:
            return record
        time.sleep(0.05)


def describe_exit(
    returncode: int,
    *,
    what: str,
    log_path: Path | None,
    serving_s: float | None = None,
) -> str:
    """One line: '<what> was killed by SIGSEGV during the model load / first computation; ...'.

    `serving_s` is how long the server had been healthy (None: it died before it ever was).
    SIGILL and SIGSEGV during the load or within `CPU_HINT_WINDOW_S` of it add the CPU hint.
    An ordinary exit says its code.
    """
    name = signal_name(returncode)
    when = DURING_LOAD if serving_s is None else f"after {_duration(serving_s)} of serving"
    verb = f"was killed by {name}" if name else f"exited with code {returncode}"
    line = f"{what} {verb} {when}"
    if log_path is not None:
        line += f"; log: {log_path}"
    early = serving_s is None or serving_s < CPU_HINT_WINDOW_S
    if early and _signal_of(returncode) in _CPU_SIGNALS:
        line += f"; {CPU_FEATURE_HINT}"
    return line


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
