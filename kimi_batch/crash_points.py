"""Named crash points: every place that writes durable state can be made to fail there, in a test.

A step that writes two things (the seeds and their quarantine, a warehouse commit and the ledger)
is where a killed process loses or duplicates rows. Each such write calls `crash_point(NAME)`
right after it; the crash-point sweep (`kimi_batch_tests/test_crash_points.py`) fails the process
at each name in turn, reruns the work, and checks that every input row ends up exactly once in
its table or in `quarantine`.

Free in production: with nothing armed, `crash_point` is one set lookup on an empty frozenset.
Two ways to arm a point:

- in the test's own process, `armed(NAME)` raises `CrashPointReached` there (an exception,
  as a failed write or a terminated run would raise);
- in a child process (a run worker, `kimi-batch ...`), `KIMI_BATCH_CRASH_AT=NAME[:kill]` in its
  environment, read once at import: `kill` sends the process SIGKILL at that point, anything else
  raises.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

__all__ = ["CRASH_AT_VARIABLE", "CrashPointReached", "armed", "crash_point"]

CRASH_AT_VARIABLE = "KIMI_BATCH_CRASH_AT"

CrashAction = Literal["raise", "kill"]


class CrashPointReached(Exception):  # noqa: N818 - it is what happened, not an error kind
    """Raised at an armed crash point: the process stops writing there, as a crash would."""

    def __init__(self, name: str) -> None:
        super().__init__(f"crash point {name!r} reached")
        self.name = name


def _from_environment() -> dict[str, CrashAction]:
    value = os.environ.get(CRASH_AT_VARIABLE, "")
    armed_points: dict[str, CrashAction] = {}
    for entry in filter(None, (part.strip() for part in value.split(","))):
        name, _, action = entry.partition(":")
        armed_points[name] = "kill" if action == "kill" else "raise"
    return armed_points


_armed: dict[str, CrashAction] = _from_environment()
_armed_names: frozenset[str] = frozenset(_armed)


def crash_point(name: str) -> None:
    """Mark a durable write just made: a test may stop the process here (free otherwise)."""
    if name not in _armed_names:
        return
    if _armed[name] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise CrashPointReached(name)


@contextmanager
def armed(name: str, action: CrashAction = "raise") -> Iterator[None]:
    """Arm one crash point in this process for the duration of the block (tests only)."""
    global _armed_names
    _armed[name] = action
    _armed_names = frozenset(_armed)
    try:
        yield
    finally:
        _armed.pop(name, None)
        _armed_names = frozenset(_armed)
