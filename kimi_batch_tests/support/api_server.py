"""The Batch API app (`kimi-batch api`) served by uvicorn on a free port, in a thread.

In-process on purpose: the server-free tier drives it with the official `openai` client over
real HTTP without a child process; the full-stack test uses the same helper next to a real
Dagster webserver and daemon.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn

from kimi_batch.batch_api.web import ApiAccess, create_app
from kimi_batch.batch_api.web.runs import BatchRuns
from kimi_batch.settings import Settings
from kimi_batch_tests.support.ports import free_port

__all__ = ["serving_api"]


@contextmanager
def serving_api(
    settings: Settings, access: ApiAccess | None = None, *, runs: BatchRuns | None = None
) -> Iterator[str]:
    """The API's base URL (`http://127.0.0.1:PORT/v1`) while the block runs.

    Without `access`, the key is the settings' `KIMI_BATCH_API_KEY` (which must be set). With
    `runs`, its launcher ticks while the block runs, as `kimi-batch api` does.
    """
    if access is None:
        if not settings.api_key:
            raise ValueError("serving_api needs KIMI_BATCH_API_KEY or an ApiAccess")
        access = ApiAccess(key=settings.api_key, bound_host="127.0.0.1")
    port = free_port()
    config = uvicorn.Config(
        create_app(settings, access),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="off",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="batch-api", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the Batch API did not start")
        time.sleep(0.05)
    if runs is not None:
        runs.start()
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        if runs is not None:
            runs.stop()
        server.should_exit = True
        thread.join(timeout=10)
