"""The batch runner: every slot of every endpoint busy, every slot warm, every finished row kept.

One worker per (endpoint, slot) pulls from a shared schedule (`schedule.py`: requests sharing a
long prefix back to back on one slot), so the server never has more requests
in flight than slots and faster endpoints simply take more work. Each worker pins its requests to
its own slot, which holds the digest; a finished row goes to the ledger before anything else
happens, so a kill at any point loses at most the requests in flight and never duplicates one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.engine.digest import SystemDigest
from kimi_batch.engine.ledger import Ledger
from kimi_batch.engine.prompt import assemble_messages
from kimi_batch.engine.requests import (
    GenerationRequest,
    GenerationResult,
    SamplingParams,
    request_key,
    row_request_id,
)
from kimi_batch.engine.schedule import PrefixSchedule
from kimi_batch.engine.stats import BatchStats, ProgressEvent, summarize
from kimi_batch.engine.warm import SlotWarmer, WarmupReport
from kimi_batch.llama.client import LlamaClient, RetryPolicy
from kimi_batch.llama.exceptions import (
    LlamaConnectionError,
    LlamaError,
    LlamaLoadingError,
    LlamaRequestError,
    LlamaResponseError,
    LlamaServerError,
    LlamaTimeoutError,
)

__all__ = ["BatchEngine", "BatchOutcome", "Endpoint", "FailedRequest", "PlannedRequest"]

logger = logging.getLogger(__name__)

PROGRESS_EVERY_S = 5.0
# A respawned server answers 503 while it loads the model: that is a wait, not a failure.
_TRANSIENT = (
    LlamaConnectionError,
    LlamaLoadingError,
    LlamaServerError,
    LlamaTimeoutError,
    LlamaResponseError,
)


class Endpoint(BaseModel):
    """One llama-server the engine may use."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_url: str
    slots: int = Field(ge=1)
    model: str
    ctx: int | None = None
    n_predict: int = Field(default=-1, description="Server cap on generated tokens; -1 none.")
    api_key: str | None = Field(default=None, repr=False)


class PlannedRequest(BaseModel):
    """A request with its keys and the params actually sent (clamped)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    request_id: str = Field(description="The output row's id: content key + input id.")
    content_key: str = Field(description="Ledger key: hash of digest, model, params, messages.")
    request: GenerationRequest
    params: SamplingParams


class FailedRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    request_id: str
    input_id: str
    tag: str
    reason: str
    attempts: int


class BatchOutcome(BaseModel):
    """Results in request order (ledger hits included), failures, and statistics."""

    model_config = ConfigDict(extra="forbid")

    model: str
    digest_sha256: str
    results: list[GenerationResult]
    failures: list[FailedRequest]
    stats: BatchStats
    warmups: list[WarmupReport]


class BatchEngine:
    """Run generation requests against one or several llama-server endpoints."""

    def __init__(
        self,
        endpoints: Sequence[Endpoint],
        digest: SystemDigest,
        ledger: Ledger,
        *,
        digest_tokens: int,
        attempts: int = 4,
        retry: RetryPolicy | None = None,
        on_progress: Callable[[ProgressEvent], None] | None = None,
        on_unreachable: Callable[[str], None] | None = None,
        load_wait_s: float = 1800.0,
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
        self.attempts = attempts
        self.retry = retry or RetryPolicy(attempts=2, backoff_s=1.0)
        self.on_progress = on_progress
        self.on_unreachable = on_unreachable
        self.load_wait_s = load_wait_s
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

    async def run(
        self, requests: Sequence[GenerationRequest], *, warm: bool = True
    ) -> BatchOutcome:
        started = time.perf_counter()
        planned = self.plan(requests)
        # Identical content is generated once, whichever inputs ask for it.
        unique = list({p.content_key: p for p in planned}.values())
        finished = self.ledger.get_many(p.content_key for p in unique)
        pending = [p for p in unique if p.content_key not in finished]
        logger.info(
            "batch: %d requests, %d already in the ledger, %d to generate",
            len(unique),
            len(finished),
            len(pending),
        )
        run = _Run(self, pending, started)
        warmups = await run.execute(warm=warm)
        by_key = {**finished, **run.results}
        ordered = [
            by_key[p.content_key].model_copy(
                update={
                    "request_id": p.request_id,
                    "input_id": p.request.input_id,
                    "tag": p.request.tag,
                }
            )
            for p in planned
            if p.content_key in by_key
        ]
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
        stats = summarize(
            new_results=list(run.results.values()),
            total=len(unique),
            from_ledger=len(finished),
            failed=len(run.failures),
            digest_tokens=self.digest_tokens,
            digest_reprefills=run.reprefills,
            max_in_flight=run.max_in_flight,
            clamped=sum(1 for p in planned if p.params != p.request.params),
            wall_s=time.perf_counter() - started,
        )
        return BatchOutcome(
            model=self.model,
            digest_sha256=self.digest.sha256,
            results=ordered,
            failures=failures,
            stats=stats,
            warmups=warmups,
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
        self.results: dict[str, GenerationResult] = {}
        self.failures: dict[str, FailedRequest] = {}
        self.reprefills = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.started = started
        self.last_progress = 0.0
        self.last_reported_done = -1
        self.completion_tokens = 0

    async def execute(self, *, warm: bool) -> list[WarmupReport]:
        engine = self.engine
        clients = [
            LlamaClient(e.base_url, api_key=e.api_key, retry=engine.retry) for e in engine.endpoints
        ]
        warmups: list[WarmupReport] = []
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
            if warm and self.total:
                for warmer, endpoint in zip(warmers, engine.endpoints, strict=True):
                    warmups.append(await warmer.warm_all(endpoint.slots, verify=False))
            workers = [
                asyncio.create_task(self._worker(client, warmer, slot_id))
                for client, warmer, endpoint in zip(clients, warmers, engine.endpoints, strict=True)
                for slot_id in range(endpoint.slots)
            ]
            await asyncio.gather(*workers)
        finally:
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
        engine = self.engine
        messages = assemble_messages(engine.digest, item.request.messages)
        params = item.params
        reason = ""
        for attempt in range(1, engine.attempts + 1):
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            sent = time.perf_counter()
            try:
                completion = await client.chat(
                    messages,
                    max_tokens=params.max_tokens,
                    temperature=params.temperature,
                    top_p=params.top_p,
                    seed=params.seed,
                    slot_id=slot_id,
                    top_logprobs=params.n_probs,
                    json_schema=params.json_schema,
                )
            except LlamaRequestError as error:
                # The request itself is wrong (too long for the context, bad params): no retry.
                reason = f"rejected by the server: {error.message}"
                self._fail(item, reason, attempt)
                return
            except _TRANSIENT as error:
                reason = f"{type(error).__name__}: {error}"
                logger.warning("request %s attempt %d failed: %s", item.request_id, attempt, reason)
                if isinstance(error, LlamaConnectionError) and engine.on_unreachable is not None:
                    # Let the owner respawn a crashed resident server (in a thread: it blocks).
                    await asyncio.to_thread(engine.on_unreachable, client.base_url)
                if isinstance(error, LlamaConnectionError | LlamaLoadingError):
                    # A model load on the target takes minutes: wait for it rather than spend
                    # the retry budget in seconds.
                    with contextlib.suppress(LlamaError):
                        await client.wait_until_healthy(engine.load_wait_s)
                await asyncio.sleep(engine.retry.delay(attempt))
                await self._rewarm_quietly(warmer, slot_id)
                continue
            except LlamaError as error:
                self._fail(item, f"{type(error).__name__}: {error}", attempt)
                return
            finally:
                self.in_flight -= 1
            latency_ms = (time.perf_counter() - sent) * 1000
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
            )
            engine.ledger.put(result)
            self.results[item.content_key] = result
            self.completion_tokens += stats.completion_tokens
            if stats.cached_tokens < engine.digest_tokens:
                # This request paid a full digest prefill (an evicted or restarted slot). The
                # slot holds the digest again now; the count is what the bench reports.
                self.reprefills += 1
            self._report_progress()
            return
        self._fail(item, reason, engine.attempts)

    async def _rewarm_quietly(self, warmer: SlotWarmer, slot_id: int) -> None:
        try:
            if await warmer.rewarm(slot_id):
                self.reprefills += 1
        except LlamaError as error:
            logger.warning("could not re-warm slot %d: %s", slot_id, error)

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
        done = len(self.results) + len(self.failures)
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
