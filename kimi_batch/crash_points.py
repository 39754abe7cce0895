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
- in a child process (a run worker, `kimi-batch ...`), `KIMI_BATCH_CRASH_AT=NAME[:kill][:N]` in
  its environment, read once at import: `kill` sends the process SIGKILL at that point, anything
  else raises; `N` stops it at the point's Nth arrival (1 by default).

`recording()` lists the points a block reaches, in order (the sweep's plan: which point each
scenario reaches, and the check that every point `declared_crash_points` finds in the source is
reached by some scenario).
"""

from __future__ import annotations

import ast
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

CRASH_AT_VARIABLE = "KIMI_BATCH_CRASH_AT"

CrashAction = Literal["raise", "kill"]


class CrashPointReached(Exception):  # noqa: N818 - it is what happened, not an error kind
    """Raised at an armed crash point: the process stops writing there, as a crash would."""

    def __init__(self, name: str) -> None:
        super().__init__(f"crash point {name!r} reached")
        self.name = name


def _from_environment() -> dict[str, tuple[CrashAction, int]]:
    value = os.environ.get(CRASH_AT_VARIABLE, "")
    armed_points: dict[str, tuple[CrashAction, int]] = {}
    for entry in filter(None, (part.strip() for part in value.split(","))):
        name, _, rest = entry.partition(":")
        action, _, arrival = rest.partition(":")
        armed_points[name] = (
            "kill" if action == "kill" else "raise",
            int(arrival) if arrival.isascii() and arrival.isdigit() else 1,
        )
    return armed_points


# name -> (what to do, at which arrival); arrivals counted per armed name.
_armed: dict[str, tuple[CrashAction, int]] = _from_environment()
_armed_names: frozenset[str] = frozenset(_armed)
_arrivals: dict[str, int] = {}
_trace: list[str] | None = None


def crash_point(name: str) -> None:
    """Mark a durable write just made: a test may stop the process here (free otherwise)."""
    if _trace is not None:
        _trace.append(name)
    if name not in _armed_names:
        return
    action, arrival = _armed[name]
    _arrivals[name] = _arrivals.get(name, 0) + 1
    if _arrivals[name] != arrival:
        return
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise CrashPointReached(name)


@contextmanager
def armed(name: str, action: CrashAction = "raise", *, arrival: int = 1) -> Iterator[None]:
    """Arm one crash point in this process for the duration of the block (tests only): the
    process stops there at the point's `arrival`th arrival within the block."""
    global _armed_names
    _armed[name] = (action, arrival)
    _arrivals.pop(name, None)
    _armed_names = frozenset(_armed)
    try:
        yield
    finally:
        _armed.pop(name, None)
        _arrivals.pop(name, None)
        _armed_names = frozenset(_armed)


@contextmanager
def recording() -> Iterator[list[str]]:
    """The crash points this process reaches within the block, in order (tests only)."""
    global _trace
    outer, _trace = _trace, []
    try:
        yield _trace
    finally:
        reached, _trace = _trace, outer
        if outer is not None:
            outer.extend(reached)


def declared_crash_points(package: Path | None = None) -> dict[str, list[str]]:
    """Every `crash_point("NAME")` in the package's source: NAME -> where (`module.py:line`)."""
    root = package or Path(__file__).resolve().parent
    found: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "crash_point"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                where = f"{path.relative_to(root).as_posix()}:{node.lineno}"
                found.setdefault(node.args[0].value, []).append(where)
    return found
