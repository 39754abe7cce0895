"""Progress: the engine's periodic report of a run, and listeners in this process.

`ProgressReporter` turns a run's counters into a `ProgressEvent` every `PROGRESS_EVERY_S`.

The engine reports to its own `on_progress` callback; the Dagster assets forward each event here
as well, so a command that runs the assets in-process (`kimi-batch demo`) draws a terminal bar
from the same events the run log prints, without parsing log lines. In a Dagster run worker
nobody listens and `notify` costs a lock and an empty loop.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from kimi_batch.engine.stats import ProgressEvent

ProgressCallback = Callable[[ProgressEvent], None]

PROGRESS_EVERY_S = 5.0

_listeners: list[ProgressCallback] = []
_lock = threading.Lock()


@contextmanager
def listening(callback: ProgressCallback) -> Iterator[None]:
    """Call `callback` with every event `notify` receives while the block runs."""
    with _lock:
        _listeners.append(callback)
    try:
        yield
    finally:
        with _lock:
            _listeners.remove(callback)


def notify(event: ProgressEvent) -> None:
    """Hand an event to every listener (none, in a Dagster run worker)."""
    with _lock:
        listeners = list(_listeners)
    for callback in listeners:
        callback(event)


class ProgressReporter:
    """Reports a run of `total` requests to `callback` at most every `PROGRESS_EVERY_S`."""

    def __init__(self, callback: ProgressCallback | None, *, total: int, started: float) -> None:
        self.callback = callback
        self.total = total
        self.started = started
        self._last = 0.0
        self._last_done = -1

    def report(
        self,
        *,
        done: int,
        failed: int,
        completion_tokens: int,
        watchdog: str = "",
        force: bool = False,
    ) -> None:
        """An event now if one is due (`force`: the final state, unless already reported)."""
        now = time.perf_counter()
        if self.callback is None or (not force and now - self._last < PROGRESS_EVERY_S):
            return
        if force and done == self._last_done:
            return  # the final state was already reported
        self._last = now
        self._last_done = done
        elapsed = now - self.started
        rate = done / elapsed if elapsed > 0 else 0.0
        self.callback(
            ProgressEvent(
                done=done,
                total=self.total,
                failed=failed,
                completion_tokens_per_s=completion_tokens / elapsed if elapsed else 0.0,
                elapsed_s=elapsed,
                eta_s=(self.total - done) / rate if rate > 0 else None,
                watchdog=watchdog,
            )
        )
