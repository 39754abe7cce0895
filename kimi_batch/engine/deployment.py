"""The deployment's resident llama-server as a run uses it, no Dagster (`LlamaDeployment`):
attached, or started once if it is not running, and never stopped, so the next run finds the
model loaded and the digest in the slots; its endpoints described for the engine, the engine's
hooks that bring it back, and the digest warmed into every slot (`warm_digest`).

Which server, binary, model, URL and API key is deployment configuration (the one `Settings`),
never run config: a launchpad user must not be able to start another binary or send a key to
another host. The Dagster adapter hands it out as `LlamaServerResource`.

A step talks to it on an event loop that a terminated run stops for certain
(`InterruptibleRunner`). Dagster terminates a run by sending SIGINT to the step process, whose
handler raises `DagsterExecutionInterruptedError` at whatever bytecode the main thread is on.
Inside an asyncio event loop that is unsafe: an exception other than KeyboardInterrupt/SystemExit
raised in a loop callback (a socket's read, a timer) is logged as "Exception in callback" and
dropped, and one raised in the step of a task nobody awaits yet is parked on that task. The
interrupt is then lost and the step runs on to the end, as if nobody had asked it to stop.

`InterruptibleRunner` takes the signal over while its loop runs: the handler only records it and
cancels the running coroutine (as `asyncio.Runner` does for Ctrl-C), every task of the loop is
cancelled (their connections close, so llama-server stops those slots), and only then, outside
the loop, the interrupt the caller names (`interrupt`: Dagster's, in
`defs/assets/stage_asset.py`) is raised for the orchestrator and the asset's own cleanup.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from contextlib import asynccontextmanager, contextmanager
from contextvars import Context
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

from kimi_batch.engine.batch_engine import BatchEngine
from kimi_batch.engine.batch_run import BatchRun
from kimi_batch.engine.budget import DEFAULT_REMEDY, PROMPT_ALLOWANCE_TOKENS
from kimi_batch.engine.deadline import DeadlinePolicy, SpeedTracker
from kimi_batch.engine.digest import SystemDigest
from kimi_batch.engine.ledger import Ledger
from kimi_batch.engine.outcome import EnginePolicy
from kimi_batch.engine.prepare import Prepared, prepare
from kimi_batch.engine.speeds import SpeedStore
from kimi_batch.engine.stats import ProgressEvent
from kimi_batch.engine.warm import SlotWarmer, WarmupReport
from kimi_batch.llama import (
    AttachedServer,
    LlamaClient,
    ResidentServer,
    ServerHandle,
    server_from_settings,
)
from kimi_batch.settings import Settings

# ---- the deployment's server --------------------------------------------------------------------


# Another run may have restarted the server for the same hang a moment ago: leave that one be.
HUNG_RESTART_MIN_AGE_S = 60.0
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LlamaDeployment:
    """The deployment's server: `settings` say which; `warn` hears of a server that died."""

    settings: Settings
    load_timeout_s: float | None = None
    warn: Callable[[str], None] = field(default=_log.warning)

    def manager(self) -> ResidentServer | AttachedServer:
        return server_from_settings(self.settings, load_timeout_s=self.load_timeout_s)

    def ensure_running(self) -> ServerHandle:
        """Attach or start; a server that died on its own (a signal, say) is named (`warn`)."""
        handle = self.manager().ensure_running()
        if handle.previous_exit:
            self.warn(f"the resident {handle.previous_exit}; it was started again")
        return handle

    def client(self) -> LlamaClient:
        return self.manager().client()

    def urls(self, handle: ServerHandle) -> list[str]:
        """The attached (or started) server first, then the scale-out servers.

        An attach-only URL is taken from the settings, not the handle: only clients may see the
        credentials it can hold.
        """
        return [self.settings.llama_url or handle.base_url, *self.settings.llama_extra_urls]

    def known_n_predict(self) -> int:
        """The answer budget where /props reports none (llama.cpp's does not report
        --n-predict): the -n of the server we started, the default budget for an attached one."""
        return self.settings.llama_n_predict

    def speed_store(self) -> SpeedStore:
        """Where the speeds a batch or a digest prefill measures wait for the next one."""
        return SpeedStore(self.settings.paths.measured_speeds_path)

    def fit_remedy(self) -> str:
        """What to change when digest + prompt + answer do not fit a slot (`{ctx_needed}`)."""
        if self.settings.llama_url:
            return (
                "start the attached server (KIMI_BATCH_LLAMA_URL) with --ctx-size at least "
                "{ctx_needed}, or fewer --parallel slots"
            )
        return DEFAULT_REMEDY

    async def prepare(self, digest: SystemDigest) -> Prepared:
        """Start or attach (in a thread: a model load blocks), then describe every endpoint."""
        handle = await asyncio.to_thread(self.ensure_running)
        return await prepare(
            self.urls(handle),
            model=handle.model,
            digest=digest,
            api_key=self.settings.llama_api_key,
            known_n_predict=self.known_n_predict(),
            slot_save_dir=self.slot_save_dir(),
        )

    def slot_save_dir(self) -> Path | None:
        """The resident server's slot-save folder; None for an attached server (its folder is
        not this process's to clean up)."""
        return None if self.settings.llama_url else self.settings.paths.slot_save_dir

    def engine_policy(self) -> EnginePolicy:
        """How an engine batch runs here (the bound on a batch's own slot saves)."""
        return EnginePolicy(slot_saves_max=self.settings.slot_saves_max)

    def respawn_if_down(self, base_url: str) -> None:
        """Engine hook: after a connection error, bring the resident server back if it died."""
        manager = self.manager()
        if isinstance(manager, ResidentServer) and base_url.rstrip("/") == manager.base_url:
            self.ensure_running()

    def restart_hung(self, base_url: str) -> None:
        """Engine hook: the resident server stopped making progress; kill and respawn it."""
        manager = self.manager()
        if isinstance(manager, ResidentServer) and base_url.rstrip("/") == manager.base_url:
            manager.restart(min_age_s=HUNG_RESTART_MIN_AGE_S)

    @asynccontextmanager
    async def session(
        self,
        digest: SystemDigest,
        ledger: Ledger,
        *,
        on_progress: Callable[[ProgressEvent], None],
        stop_at: datetime | None = None,
    ) -> AsyncIterator[BatchRun]:
        """One engine run on the digest prepared here, open while the block adds requests to
        it, stopping at `stop_at` (a batch's outcome says whether that cut it short)."""
        prepared = await self.prepare(digest)
        engine = BatchEngine(
            prepared.endpoints,
            digest,
            ledger,
            digest_tokens=prepared.digest_tokens,
            policy=self.engine_policy(),
            on_progress=on_progress,
            on_unreachable=self.respawn_if_down,
            on_hung=self.restart_hung,
            speed_store=self.speed_store(),
        )
        async with engine.session(stop_at=stop_at) as run:
            yield run


async def warm_digest(
    server: LlamaDeployment, digest: SystemDigest
) -> tuple[int, list[WarmupReport]]:
    """Prepare and warm in one event loop; returns the digest's tokens and a report per endpoint.
    A slot too small for the digest, a question and an answer raises `ContextTooSmallError`: it
    would truncate every answer of the night, so it is refused while it is still a setting."""
    prepared = await server.prepare(digest)
    tokens = prepared.digest_tokens
    answer = prepared.endpoints[0].n_predict
    prepared.check_fit(
        prompt_tokens=PROMPT_ALLOWANCE_TOKENS,
        answer_tokens=answer if answer > 0 else server.settings.llama_n_predict,
        remedy=server.fit_remedy(),
    )
    reports = []
    for endpoint in prepared.endpoints:
        # The speeds last measured bound the prefill; the prefill measures the prompt speed.
        speeds = SpeedTracker(DeadlinePolicy(), store=server.speed_store(), model=endpoint.model)
        async with LlamaClient(endpoint.base_url, api_key=endpoint.api_key) as client:
            warmer = SlotWarmer(
                client,
                digest,
                digest_tokens=tokens,
                model=endpoint.model,
                ctx=endpoint.ctx,
                prefill_timeout_s=speeds.deadline_s(tokens, 1),
                save_dir=endpoint.slot_save_dir,
            )
            report = await warmer.warm_all(endpoint.slots, verify=True)
        speeds.observe_prompt(tokens * len(report.prefilled_slots), report.prefill_ms)
        reports.append(report)
    return tokens, reports


# ---- event loops that a terminated run stops for certain ----------------------------------------


T = TypeVar("T")

# Dagster's interrupt handlers map SIGTERM onto the SIGINT handler (run workers on Kubernetes).
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


# What an interrupted run raises once its loop has stopped.
Interrupt = Callable[[], BaseException]


class InterruptibleRunner:
    """Runs coroutines on an `asyncio.Runner`'s loop; `run` turns SIGINT/SIGTERM into a
    cancelled coroutine, then raises `interrupt()` once every task of the loop has stopped.
    Once interrupted it stays so: the cleanup a step still runs on it ends in the interrupt
    too."""

    def __init__(self, runner: asyncio.Runner, interrupt: Interrupt) -> None:
        self._runner = runner
        self._interrupt = interrupt
        self.interrupted = False

    def run(self, coro: Coroutine[Any, Any, T], *, context: Context | None = None) -> T:
        if threading.current_thread() is not threading.main_thread():
            return self._runner.run(coro, context=context)  # signals reach the main thread only
        loop = self._runner.get_loop()
        task = loop.create_task(coro, context=context)

        def on_signal(_signo: int, _frame: FrameType | None) -> None:
            # Runs between two bytecodes of the main thread, maybe inside the loop: only record
            # and schedule (what asyncio.Runner's own SIGINT handler does).
            self.interrupted = True
            loop.call_soon_threadsafe(task.cancel)

        previous = {sig: signal.signal(sig, on_signal) for sig in _SIGNALS}
        try:
            self._until_stopped(loop, task)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if self.interrupted:
            raise self._interrupt()
        return task.result()

    def _until_stopped(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> None:
        try:
            loop.run_until_complete(task)
        except (asyncio.CancelledError, Exception):
            if not self.interrupted:
                raise
            # Interrupted: what the coroutine raised on its way out is not why it stopped.
        if self.interrupted:
            # Whatever the coroutine left running (a task it did not await) stops too.
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for left in pending:
                left.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))


@contextmanager
def interruptible_runner(interrupt: Interrupt) -> Iterator[InterruptibleRunner]:
    """`asyncio.Runner()` for a step (see the module); closed on exit."""
    with asyncio.Runner() as runner:
        yield InterruptibleRunner(runner, interrupt)
