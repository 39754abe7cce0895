"""One engine run of a step: the digest prepared on the server, under the run's window."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import datetime

from kimi_batch.defs.assets.context import RunContext
from kimi_batch.defs.assets.window import window_end
from kimi_batch.defs.resources.digest import DigestResource
from kimi_batch.defs.resources.llama import LlamaServerResource
from kimi_batch.engine import BatchEngine, BatchRun, Ledger, ProgressEvent, notify


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
    loaded, server = digest.load(), llama.server()
    prepared = await server.prepare(loaded)
    engine = BatchEngine(
        prepared.endpoints,
        loaded,
        ledger,
        digest_tokens=prepared.digest_tokens,
        policy=server.engine_policy(),
        on_progress=_progress_reporter(context, label),
        on_unreachable=server.respawn_if_down,
        on_hung=server.restart_hung,
        speed_store=server.speed_store(),
    )
    ends = [end for end in (window_end(context), expires_at) if end is not None]
    async with engine.session(stop_at=min(ends, default=None)) as run:
        yield run
