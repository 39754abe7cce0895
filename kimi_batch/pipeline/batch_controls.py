"""What a caller may add to an engine batch besides the run's nightly window: its own end, a
cancel poll, and the planned requests' keys (the Batch API's run uses each)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from kimi_batch.engine import PlannedRow

T = TypeVar("T")

# How often a batch with a cancel poll (`BatchControls.cancelled`) asks it.
CANCEL_POLL_S = 0.25


@dataclass(frozen=True)
class BatchControls:
    """What a caller may add to an engine batch besides the run's nightly window (the Batch
    API's run uses each).

    `expires_at`: the work's own end: past it nothing new is sent, and what is done lands (it
    is never resumed, unlike a night's partition). `cancelled`: polled while the batch runs;
    True cancels the requests in flight (their connections close, so llama-server stops those
    slots) and raises `BatchCancelledError`. `on_planned`: each request's keys, heard before
    the first is sent.
    """

    expires_at: datetime | None = None
    cancelled: Callable[[], bool] | None = None
    on_planned: Callable[[Sequence[PlannedRow]], None] | None = None

    def expired(self) -> bool:
        return self.expires_at is not None and datetime.now(UTC) >= self.expires_at


class BatchCancelledError(Exception):
    """The caller's `BatchControls.cancelled` said so: the batch stopped, nothing landed (the
    answers finished so far are in the ledger)."""


async def unless_cancelled(work: Coroutine[Any, Any, T], cancelled: Callable[[], bool]) -> T:
    """`work`'s result; `BatchCancelledError` once `cancelled()` says so (polled every
    CANCEL_POLL_S; `work` is cancelled first: its requests in flight with it)."""
    task = asyncio.create_task(work)
    while True:
        done, _ = await asyncio.wait({task}, timeout=CANCEL_POLL_S)
        if done:
            return task.result()
        if cancelled():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            raise BatchCancelledError("the batch was cancelled")
