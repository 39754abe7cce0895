"""The batch runner: every slot of every endpoint busy, every slot warm, every finished row kept.

One worker per (endpoint, slot) pulls from a shared schedule (`schedule.py`: requests sharing a
long prefix back to back on one slot), so the server never has more requests
in flight than slots and faster endpoints simply take more work. Each worker pins its requests to
its own slot, which holds the digest; a finished row goes to the ledger before anything else
happens, so a kill at any point loses at most the requests in flight and never duplicates one.

The engine is the one retry layer: a request is sent once per attempt (the client never retries
generation), each attempt bounded by a deadline from the request's own work (`deadline.py`);
between attempts the engine recovers the endpoint (respawn, wait for the model, restore the digest
into the slot). A watchdog (`watchdog.py`) tells a hung server from a slow one, has it restarted
and sends the requests it held again. Results live in the ledger only: the outcome carries
figures and failures, and `BatchOutcome.iter_results` streams the rows back in request order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from kimi_batch.engine.deadline import SpeedTracker, estimate_prompt_tokens
from kimi_batch.engine.digest import SystemDigest
from kimi_batch.engine.generation import (
    GenerationRequest,
    GenerationResult,
    request_key,
    row_request_id,
)
from kimi_batch.engine.ledger import Ledger
from kimi_batch.engine.outcome import (
    BatchOutcome,
    ClientFactory,
    Endpoint,
    EnginePolicy,
    FailedRequest,
    PlannedRequest,
    PlannedRow,
    default_client,
)
from kimi_batch.engine.prompt import assemble_messages
from kimi_batch.engine.schedule import PrefixSchedule
from kimi_batch.engine.stats import ProgressEvent, StatsAccumulator
from kimi_batch.engine.warm import SlotWarmer, WarmupReport
from kimi_batch.engine.watchdog import EndpointWatch
from kimi_batch.llama import (
    ChatCompletion,
    LlamaClient,
    LlamaConnectionError,
    LlamaError,
    LlamaLoadingError,
    LlamaRequestError,
    LlamaResponseError,
    LlamaServerError,
    LlamaTimeoutError,
)

__all__ = [
    "BatchEngine",
    "BatchOutcome",
    "ClientFactory",
    "Endpoint",
    "EndpointHungError",
    "EnginePolicy",
    "FailedRequest",
    "PlannedRequest",
    "PlannedRow",
]

logger = logging.getLogger(__name__)

PROGRESS_EVERY_S = 5.0


class EndpointHungError(LlamaTimeoutError):
    """The watchdog cancelled this send: the endpoint made no progress for a stall period."""


# A respawned server answers 503 while it loads the model: that is a wait, not a failure.
_TRANSIENT = (
    LlamaConnectionError,
    LlamaLoadingError,
    LlamaServerError,
    LlamaTimeoutError,
    LlamaResponseError,
)


class BatchEngine:
    """Run generation requests against one or several llama-server endpoints."""

    def __init__(
        self,
        endpoints: Sequence[Endpoint],
        digest: SystemDigest,
        ledger: Ledger,
        *,
        digest_tokens: int,
        policy: EnginePolicy | None = None,
        client_factory: ClientFactory = default_client,
        on_progress: Callable[[ProgressEvent], None] | None = None,
        on_unreachable: Callable[[str], None] | None = None,
        on_hung: Callable[[str], None] | None = None,
    ) -> None:
        if not endpoints:
            raise ValueError("at least one endpoint is needed")
        models = {endpoint.model for endpoint in endpoints}
        if len(models) != 1:
            # Rows are keyed by model: mixing models would make one batch two datasets.
            raise ValueError(f"all endpoints must serve the same model, got {sorted(models)}")
        self.endpoints = list(endpoints)
        self.model = models.pop()
        self.digest = digest
        self.ledger = ledger
        self.digest_tokens = digest_tokens
        self.policy = policy or EnginePolicy()
        self.client_factory = client_factory
        self.on_progress = on_progress
        self.on_unreachable = on_unreachable
        self.on_hung = on_hung
        self.speeds = SpeedTracker(self.policy.deadline)
        self.n_predict_cap = min(
            (e.n_predict for e in self.endpoints if e.n_predict > 0), default=None
        )

    def plan(self, requests: Sequence[GenerationRequest]) -> list[PlannedRequest]:
        """Clamp max_tokens to the servers' n_predict and compute each request's keys."""
        planned: list[PlannedRequest] = []
        for request in requests:
            params = request.params
            if self.n_predict_cap is not None and params.max_tokens > self.n_predict_cap:
                # The server would stop at its own -n and report "length": say so up front.
                params = params.model_copy(update={"max_tokens": self.n_predict_cap})
            content_key = request_key(
                digest_sha256=self.digest.sha256,
                model=self.model,
                params=params,
                messages=list(request.messages),
            )
            planned.append(
                PlannedRequest(
                    request_id=row_request_id(content_key, request.input_id),
                    content_key=content_key,
                    request=request,
                    params=params,
                )
            )
        return planned

    def deadline_s(self, item: PlannedRequest, *, cold: bool = False) -> float:
        """Seconds this request may take at the speeds measured so far. The digest is cached
        in a warm slot; a slot not known to hold it (`cold`) may have to prefill it first."""
        prompt = estimate_prompt_tokens(
            list(item.request.messages), self.policy.deadline.chars_per_token
        )
        if cold:
            prompt += self.digest_tokens
        return self.speeds.deadline_s(prompt, item.params.max_tokens)

    async def run(
        self,
        requests: Sequence[GenerationRequest],
        *,
        warm: bool = True,
        stop_at: datetime | None = None,
    ) -> BatchOutcome:
        """Generate what the ledger lacks. Past `stop_at` nothing new is sent, the requests in
        flight finish, and the outcome counts the rest as `stats.not_started`."""
        if stop_at is not None and stop_at.tzinfo is None:
            raise ValueError("stop_at must be timezone-aware")
        started = time.perf_counter()
        planned = self.plan(requests)
        # Identical content is generated once, whichever inputs ask for it.
        unique = list({p.content_key: p for p in planned}.values())
        finished = self.ledger.finished_keys(p.content_key for p in unique)
        pending = [p for p in unique if p.content_key not in finished]
        logger.info(
            "batch: %d requests, %d already in the ledger, %d to generate",
            len(unique),
            len(finished),
            len(pending),
        )
        run = _Run(self, pending, started)
        run.stop_at = stop_at
        warmups = await run.execute(warm=warm)
        # Failures are keyed by content; each input that asked for it gets its own entry.
        failures = [
            run.failures[p.content_key].model_copy(
                update={
                    "request_id": p.request_id,
                    "input_id": p.request.input_id,
                    "tag": p.request.tag,
                }
            )
            for p in planned
            if p.content_key in run.failures
        ]
        stats = run.accumulator.summary(
            total=len(unique),
            from_ledger=len(finished),
            failed=len(run.failures),
            not_started=run.not_started,
            clamped=sum(1 for p in planned if p.params != p.request.params),
            digest_reprefills=run.reprefills,
            hangs=sum(watch.hangs for watch in run.watches.values()),
            max_in_flight=run.max_in_flight,
            wall_s=time.perf_counter() - started,
        )
        return BatchOutcome(
            model=self.model,
            digest_sha256=self.digest.sha256,
            planned=[
                PlannedRow(
                    request_id=p.request_id,
                    content_key=p.content_key,
                    input_id=p.request.input_id,
                    tag=p.request.tag,
                )
                for p in planned
            ],
            failures=failures,
            stats=stats,
            warmups=warmups,
            stopped_at_window=run.not_started > 0,
        )


def _prefix_text(item: PlannedRequest) -> str:
    """What the server sees after the digest, as far as prefix sharing goes."""
    return "\n".join(f"{m.role}\x00{m.content}" for m in item.request.messages)


def _work(item: PlannedRequest) -> int:
    """Rough token cost of a request: its generated tokens plus ~4 characters per prompt token."""
    return item.params.max_tokens + len(_prefix_text(item)) // 4


class _Run:
    """State of one `BatchEngine.run` call."""

    def __init__(self, engine: BatchEngine, pending: list[PlannedRequest], started: float):
        self.engine = engine
        # Requests sharing a long prefix (variants of one seed) run back to back on one slot.
        self.schedule = PrefixSchedule(pending, text=_prefix_text, work=_work)
        self.total = len(pending)
        self.accumulator = StatsAccumulator(engine.digest_tokens)
        self.failures: dict[str, FailedRequest] = {}
        self.not_started = 0
        self.stop_at: datetime | None = None
        self.watches: dict[LlamaClient, EndpointWatch] = {}
        self.reprefills = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.started = started
        self.last_progress = 0.0
        self.last_reported_done = -1
        self.completion_tokens = 0

    @property
    def done(self) -> int:
        return self.accumulator.generated + len(self.failures) + self.not_started

    def _past_stop(self) -> bool:
        return self.stop_at is not None and datetime.now(UTC) >= self.stop_at

    async def execute(self, *, warm: bool) -> list[WarmupReport]:
        engine = self.engine
        clients = [engine.client_factory(e) for e in engine.endpoints]
        self.watches = {c: EndpointWatch(c, engine.policy.watchdog) for c in clients}
        warmups: list[WarmupReport] = []
        watchdog: asyncio.Task[None] | None = None
        try:
            warmers = [
                SlotWarmer(
                    client,
                    engine.digest,
                    digest_tokens=engine.digest_tokens,
                    model=endpoint.model,
                    ctx=endpoint.ctx,
                )
                for client, endpoint in zip(clients, engine.endpoints, strict=True)
            ]
            if warm and self.total and not self._past_stop():
                for warmer, endpoint in zip(warmers, engine.endpoints, strict=True):
                    warmups.append(await warmer.warm_all(endpoint.slots, verify=False))
                    self.watches[warmer.client].warm_slots.update(range(endpoint.slots))
            watchdog = asyncio.create_task(self._watch())
            workers = [
                asyncio.create_task(self._worker(client, warmer, slot_id))
                for client, warmer, endpoint in zip(clients, warmers, engine.endpoints, strict=True)
                for slot_id in range(endpoint.slots)
            ]
            await asyncio.gather(*workers)
        finally:
            if watchdog is not None:
                watchdog.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watchdog
            for client in clients:
                await client.aclose()
        self._report_progress(force=True)
        return warmups

    async def _worker(self, client: LlamaClient, warmer: SlotWarmer, slot_id: int) -> None:
        lane = self.schedule.lane()
        while (item := lane.next()) is not None:
            await self._process(client, warmer, slot_id, item)

    async def _process(
        self, client: LlamaClient, warmer: SlotWarmer, slot_id: int, item: PlannedRequest
    ) -> None:
        """Send, recover between attempts, record: at most `policy.attempts` sends."""
        if self._past_stop():
            # The window closed: leave it for the next run (the ledger lacks it, so it resumes).
            self.not_started += 1
            return
        attempts = self.engine.policy.attempts
        reason = ""
        for attempt in range(1, attempts + 1):
            sent = time.perf_counter()
            try:
                completion = await self._send(client, slot_id, item)
            except LlamaRequestError as error:
                # The request itself is wrong (too long for the context, bad params): no retry.
                self._fail(item, f"rejected by the server: {error.message}", attempt)
                return
            except _TRANSIENT as error:
                reason = f"{type(error).__name__}: {error}"
                logger.warning("request %s attempt %d failed: %s", item.request_id, attempt, reason)
                if attempt < attempts:
                    await self._recover(client, warmer, slot_id, error, attempt)
                continue
            except LlamaError as error:
                self._fail(item, f"{type(error).__name__}: {error}", attempt)
                return
            latency_ms = (time.perf_counter() - sent) * 1000
            self._record(client, slot_id, item, completion, latency_ms)
            return
        self._fail(item, reason, attempts)

    async def _send(
        self, client: LlamaClient, slot_id: int, item: PlannedRequest
    ) -> ChatCompletion:
        """One attempt, bounded by the request's deadline; the watchdog may cancel it."""
        engine = self.engine
        watch = self.watches[client]
        await watch.ready.wait()  # never send to a server that is being restarted
        params = item.params
        deadline_s = engine.deadline_s(item, cold=slot_id not in watch.warm_slots)
        task = asyncio.create_task(
            client.chat(
                assemble_messages(engine.digest, item.request.messages),
                max_tokens=params.max_tokens,
                temperature=params.temperature,
                top_p=params.top_p,
                seed=params.seed,
                slot_id=slot_id,
                top_logprobs=params.n_probs,
                json_schema=params.json_schema,
                timeout_s=deadline_s,
            )
        )
        if not watch.sending:
            watch.mark_progress()  # the stall clock starts with the first request in flight
        watch.sending[slot_id] = task
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:
            task.cancel()
            raise
        finally:
            self.in_flight -= 1
            watch.sending.pop(slot_id, None)
        if task.cancelled():
            stall = engine.policy.watchdog.stall_s
            raise EndpointHungError(f"{client.base_url} made no progress for {stall:.0f} s")
        return task.result()

    async def _recover(
        self,
        client: LlamaClient,
        warmer: SlotWarmer,
        slot_id: int,
        error: LlamaError,
        attempt: int,
    ) -> None:
        """Bring the endpoint and the slot back before the next attempt."""
        engine = self.engine
        if isinstance(error, EndpointHungError):
            # The watchdog restarts the server once for every request it held.
            await self.watches[client].ready.wait()
        elif isinstance(error, LlamaConnectionError | LlamaLoadingError):
            if isinstance(error, LlamaConnectionError) and engine.on_unreachable is not None:
                # Let the owner respawn a crashed resident server (in a thread: it blocks).
                await asyncio.to_thread(engine.on_unreachable, client.base_url)
            # A model load on the target takes minutes: wait for it rather than spend the
            # attempts in seconds.
            with contextlib.suppress(LlamaError):
                await client.wait_until_healthy(engine.policy.load_wait_s)
        await asyncio.sleep(engine.policy.delay(attempt))
        await self._rewarm_quietly(warmer, slot_id)

    def _record(
        self,
        client: LlamaClient,
        slot_id: int,
        item: PlannedRequest,
        completion: ChatCompletion,
        latency_ms: float,
    ) -> None:
        engine = self.engine
        stats = completion.stats
        result = GenerationResult(
            request_id=item.content_key,
            input_id=item.request.input_id,
            tag=item.request.tag,
            model=engine.model,
            digest_sha256=engine.digest.sha256,
            text=completion.text,
            finish_reason=completion.finish_reason,
            prompt_tokens=stats.prompt_tokens,
            cached_tokens=stats.cached_tokens,
            completion_tokens=stats.completion_tokens,
            prompt_ms=stats.prompt_ms,
            predicted_ms=stats.predicted_ms,
            latency_ms=latency_ms,
            endpoint=client.base_url,
            slot_id=slot_id,
            logprobs=completion.logprobs,
            created_at=datetime.now(UTC),
            reasoning_content=completion.reasoning_content,
            draft_tokens=stats.draft_tokens,
            draft_accepted_tokens=stats.draft_accepted_tokens,
        )
        # Truncated and empty answers are recorded as they are (finish_reason says which):
        # what counts as final is the caller's decision.
        engine.ledger.put(result)
        self.accumulator.add(result)
        engine.speeds.observe(result)
        self.completion_tokens += stats.completion_tokens
        if stats.cached_tokens < engine.digest_tokens:
            # This request paid a full digest prefill (an evicted or restarted slot). The
            # slot holds the digest again now; the count is what the bench reports.
            self.reprefills += 1
        self.watches[client].warm_slots.add(slot_id)
        self._report_progress()

    async def _watch(self) -> None:
        """Probe every endpoint while requests are in flight; restart the ones that hang."""
        every = self.engine.policy.watchdog.every_s
        while True:
            await asyncio.sleep(every)
            watches = list(self.watches.values())
            stalled = await asyncio.gather(*(watch.stalled() for watch in watches))
            for watch, hung in zip(watches, stalled, strict=True):
                if hung:
                    await self._restart_hung(watch)

    async def _restart_hung(self, watch: EndpointWatch) -> None:
        engine = self.engine
        watch.ready.clear()
        watch.warm_slots.clear()  # a restarted server starts with empty slots
        watch.hangs += 1
        cancelled = watch.cancel_sends()
        logger.warning(
            "restarting hung %s; %d request(s) will be sent again", watch.base_url, cancelled
        )
        try:
            if engine.on_hung is not None:
                await asyncio.to_thread(engine.on_hung, watch.base_url)
            with contextlib.suppress(LlamaError):
                await watch.client.wait_until_healthy(engine.policy.load_wait_s)
        except Exception:
            logger.exception(
                "restarting %s failed; its requests are retried anyway", watch.base_url
            )
        finally:
            watch.mark_progress()
            watch.ready.set()

    async def _rewarm_quietly(self, warmer: SlotWarmer, slot_id: int) -> None:
        warm_slots = self.watches[warmer.client].warm_slots
        try:
            if await warmer.rewarm(slot_id):
                self.reprefills += 1
        except LlamaError as error:
            warm_slots.discard(slot_id)  # the next send may prefill the digest: more time
            logger.warning("could not re-warm slot %d: %s", slot_id, error)
        else:
            warm_slots.add(slot_id)

    def _fail(self, item: PlannedRequest, reason: str, attempts: int) -> None:
        self.failures[item.content_key] = FailedRequest(
            request_id=item.content_key,
            input_id=item.request.input_id,
            tag=item.request.tag,
            reason=reason,
            attempts=attempts,
        )
        self._report_progress()

    def _report_progress(self, *, force: bool = False) -> None:
        callback = self.engine.on_progress
        now = time.perf_counter()
        done = self.done
        if callback is None or (not force and now - self.last_progress < PROGRESS_EVERY_S):
            return
        if force and done == self.last_reported_done:
            return  # the final state was already reported
        self.last_progress = now
        self.last_reported_done = done
        elapsed = now - self.started
        rate = done / elapsed if elapsed > 0 else 0.0
        callback(
            ProgressEvent(
                done=done,
                total=self.total,
                failed=len(self.failures),
                completion_tokens_per_s=self.completion_tokens / elapsed if elapsed else 0.0,
                elapsed_s=elapsed,
                eta_s=(self.total - done) / rate if rate > 0 else None,
            )
        )
