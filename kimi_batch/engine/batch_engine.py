"""The batch runner: every slot of every endpoint busy, every slot warm, every finished row kept.

`BatchEngine` plans a batch (keys, clamped params, what the ledger already has) and sums up its
outcome; a `batch_run.BatchRun` does the work. `BatchEngine.session` keeps a run open while its
caller adds requests (a night's stages, partition by partition); `BatchEngine.run` is one batch. One worker per (endpoint, slot) pulls from a shared
schedule (`schedule.py`: requests sharing a long prefix back to back on one slot), so the server
never has more requests in flight than slots and faster endpoints simply take more work. Each worker pins its requests to
its own slot, which holds the digest (the engine's, or a request's own, a Batch API line's system
prompt: `slot_digests.py`; `count_digests` sizes those before they are planned); a finished row goes to the ledger before anything else
happens, so a kill at any point loses at most the requests in flight and never duplicates one.

The engine is the one retry layer: a request is sent once per attempt (the client never retries
generation), each attempt bounded by a deadline from the request's own work (`deadline.py`);
between attempts the engine recovers the endpoint (`recover.py`: respawn, wait for the model,
restore the digest into the slot). A watchdog (`watchdog.py`) tells a hung server from a slow
one, has it restarted and sends the requests it held again. Results live in the ledger only: the outcome carries
figures and failures, and `BatchOutcome.iter_results` streams the rows back in request order.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import datetime

from kimi_batch.engine.batch_run import BatchRun
from kimi_batch.engine.budget import answer_cap
from kimi_batch.engine.deadline import SpeedTracker, estimate_prompt_tokens
from kimi_batch.engine.digest import NO_DIGEST, SystemDigest
from kimi_batch.engine.generation import GenerationRequest, request_key, row_request_id
from kimi_batch.engine.ledger import Ledger
from kimi_batch.engine.outcome import (
    BatchOutcome,
    ClientFactory,
    Endpoint,
    EnginePolicy,
    PlannedRequest,
    default_client,
)
from kimi_batch.engine.speeds import SpeedStore
from kimi_batch.engine.stats import ProgressEvent


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
        speed_store: SpeedStore | None = None,
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
        self.speeds = SpeedTracker(self.policy.deadline, store=speed_store, model=self.model)
        # Each digest's length in the server's tokens: the engine's, and requests' own ones
        # once `count_digests` has seen them.
        self._digest_tokens = {digest.sha256: digest_tokens, NO_DIGEST.sha256: 0}

    def digest_of(self, request: GenerationRequest) -> SystemDigest:
        """The digest a request starts with: its own, else the engine's; none (the empty
        digest) for a raw-prompt completion, which is sent alone: its slot then holds no
        digest, its budget counts none, and its row names none."""
        if request.kind == "completion":
            return NO_DIGEST
        return request.digest or self.digest

    def tokens_of(self, digest_sha256: str) -> int:
        tokens = self._digest_tokens.get(digest_sha256)
        if tokens is None:
            raise ValueError("a request's own digest is not counted: await count_digests first")
        return tokens

    async def count_digests(self, requests: Sequence[GenerationRequest]) -> None:
        """Count the tokens of the requests' own digests (the first server's tokenizer)."""
        new = {
            r.digest.sha256: r.digest
            for r in requests
            if r.digest is not None and r.digest.sha256 not in self._digest_tokens
        }
        if not new:
            return
        async with self.client_factory(self.endpoints[0]) as client:
            for sha, digest in new.items():
                text = digest.text
                self._digest_tokens[sha] = len(await client.tokenize(text)) if text else 0

    def answer_cap(self, digest_sha256: str) -> int | None:
        """No budget a server cannot hold: its n_predict and its slot's context after the
        digest; None when neither is known."""
        tokens = self.tokens_of(digest_sha256)
        caps = [
            answer_cap(n_predict=e.n_predict, slot_ctx=e.ctx, digest_tokens=tokens)
            for e in self.endpoints
        ]
        return min((c for c in caps if c is not None), default=None)

    def plan(self, requests: Sequence[GenerationRequest]) -> list[PlannedRequest]:
        """Clamp max_tokens to what every server holds and compute each request's keys (its
        own digest's sha in the key; `count_digests` first when requests carry their own)."""
        planned: list[PlannedRequest] = []
        caps: dict[str, int | None] = {}
        for request in requests:
            params, digest = request.params, self.digest_of(request)
            if digest.sha256 not in caps:
                caps[digest.sha256] = self.answer_cap(digest.sha256)
            cap = caps[digest.sha256]
            if cap is not None and params.max_tokens > cap:
                # The server would stop at its own -n and report "length": say so up front.
                params = params.model_copy(update={"max_tokens": cap})
            content_key = request_key(
                digest_sha256=digest.sha256,
                model=self.model,
                params=params,
                messages=list(request.messages),
                sample=request.sample,
                kind=request.kind,
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
            prompt += self.tokens_of(self.digest_of(item.request).sha256)
        return self.speeds.deadline_s(prompt, item.params.max_tokens)

    @asynccontextmanager
    async def session(
        self,
        *,
        warm: bool = True,
        stop_at: datetime | None = None,
    ) -> AsyncIterator[BatchRun]:
        """An open run: `run.add(requests)` while the block runs, each awaitable for its
        outcome. Leaving the block closes it and waits until everything added is settled. Past
        `stop_at` nothing new is sent (added requests included), the requests in flight finish,
        and the rest count as `stats.not_started`."""
        if stop_at is not None and stop_at.tzinfo is None:
            raise ValueError("stop_at must be timezone-aware")
        run = BatchRun(self, time.perf_counter(), stop_at=stop_at)
        execution = asyncio.create_task(run.execute(warm=warm))
        try:
            yield run
        except BaseException:
            execution.cancel()
            await asyncio.wait({execution})
            if not execution.cancelled():
                execution.exception()  # what the block raised says it (often this very error)
            raise
        run.close()
        await execution

    async def run(
        self,
        requests: Sequence[GenerationRequest],
        *,
        warm: bool = True,
        stop_at: datetime | None = None,
    ) -> BatchOutcome:
        """Generate what the ledger lacks: one run of `requests` alone (see `session`)."""
        await self.count_digests(requests)
        async with self.session(warm=warm, stop_at=stop_at) as run:
            submission = run.add(requests)
        return submission.outcome()
