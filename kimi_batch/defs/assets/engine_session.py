"""One engine run of a step: the digest prepared on the server, under the run's window."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import datetime

from kimi_batch.defs.assets.context import RunContext
from kimi_batch.defs.assets.window import window_end
from kimi_batch.defs.resources.digest import DigestResource
from kimi_batch.defs.resources.llama import LlamaServerResource
from kimi_batch.engine import BatchRun, Ledger, ProgressEvent, notify


def _progress_reporter(context: RunContext, label: str) -> Callable[[ProgressEvent], None]:
    """The run log gets the periodic line; in-process listeners (a terminal bar) the event."""

    def report(event: ProgressEvent) -> None:
        context.log.info(str(event))
        notify(event.model_copy(update={"label": label}))

    return report


@asynccontextmanager
async def engine_session(
    context: RunContext,
    llama: LlamaServerResource,
    digest: DigestResource,
    ledger: Ledger,
    *,
    label: str,
    expires_at: datetime | None = None,
) -> AsyncIterator[BatchRun]:
    """One engine run under the run's window and the work's own end (`expires_at`, whichever
    comes first), open while the block adds requests to it (a batch's outcome says whether
    either cut it short); progress is logged as `label`."""
    ends = [end for end in (window_end(context), expires_at) if end is not None]
    reporter = _progress_reporter(context, label)
    session = llama.server().session(
        digest.load(), ledger, on_progress=reporter, stop_at=min(ends, default=None)
    )
    async with session as run:
        yield run
