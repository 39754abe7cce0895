"""The bench's child processes stop with it, however it ends.

The bench starts long-lived children (its llama-server, a `dagster-daemon` with a code server and
run workers): a bench killed by SIGTERM (a `timeout`, a CI job cancelled) or SIGHUP would leave
them running, holding the cores and the port. `signals_as_exit` turns those signals into
`SystemExit`, so every `finally` on the way out runs; each process tree started with
`start_group` is its own process group, and `stop_group` ends the whole group.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from types import FrameType

__all__ = ["signals_as_exit", "start_group", "stop_group"]

# SIGINT already raises KeyboardInterrupt.
_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
STOP_GRACE_S = 15.0


def _exit(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


@contextmanager
def signals_as_exit() -> Iterator[None]:
    """While inside, SIGTERM and SIGHUP raise SystemExit (exit status 128 + the signal)."""
    previous = {sig: signal.signal(sig, _exit) for sig in _SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def start_group(
    argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, log: Path
) -> subprocess.Popen[bytes]:
    """`argv` as the leader of a new process group (its children stay in the group)."""
    with log.open("wb") as out:
        return subprocess.Popen(
            list(argv),
            env=dict(env),
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _signal_group(pgid: int, sig: signal.Signals) -> bool:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def stop_group(process: subprocess.Popen[bytes], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM to the group, `grace_s` for its leader to exit, then SIGKILL to what is left."""
    if _signal_group(process.pid, signal.SIGTERM):
        with suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace_s)
    # Children that outlived the leader (a run worker mid-step) go too.
    _signal_group(process.pid, signal.SIGKILL)
    process.wait()
