"""Progress listeners: whoever runs batches in this process can watch them.

The engine reports to its own `on_progress` callback; the Dagster assets forward each event here
as well, so a command that runs the assets in-process (`kimi-batch demo`) draws a terminal bar
from the same events the run log prints, without parsing log lines. In a Dagster run worker
nobody listens and `notify` costs a lock and an empty loop.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from kimi_batch.engine.stats import ProgressEvent

__all__ = ["ProgressCallback", "listening", "notify"]

ProgressCallback = Callable[[ProgressEvent], None]

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
