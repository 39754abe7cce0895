"""One set of requests added to a run (`BatchRun.add`): the keys it waits for, and its outcome.

A run settles each content key once: generated (in the ledger), failed, or not started (the stop
time passed). It tells every submission waiting for that key; a submission whose keys are all
settled is done, and `await submission` gives its `BatchOutcome`, the same a one-shot
`BatchEngine.run` of those requests returns. Its counts, tokens and latencies are its own; the
in-flight peak, hangs, re-prefills and warm-ups are the run's (`RunFigures`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Generator
from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict

from kimi_batch.engine.generation import GenerationResult
from kimi_batch.engine.outcome import (
    BatchOutcome,
    FailedRequest,
    PlannedRequest,
    PlannedRow,
    distinct,
)
from kimi_batch.engine.stats import StatsAccumulator
from kimi_batch.engine.warm import WarmupReport


class RunFigures(BaseModel):
    """What a run counts for all its submissions together."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    digest_sha256: str
    digest_reprefills: int
    hangs: int
    max_in_flight: int
    warmups: list[WarmupReport]
    digest_warmups: int = 0
    digest_restores: int = 0
    own_digest_prefills: int = 0
    slot_saves_peak: int = 0


class Submission:
    """The requests of one `BatchRun.add` (see the module docstring)."""

    def __init__(
        self,
        planned: list[PlannedRequest],
        finished: set[str],
        *,
        in_flight: int,
        figures: Callable[[], RunFigures],
    ) -> None:
        self.started = time.perf_counter()
        self.planned = planned
        self.unique = distinct(planned)
        self.before = {p.content_key for p in self.unique} & finished
        self.in_flight_at_start = in_flight
        self.accumulator = StatsAccumulator()
        self.failures: dict[str, FailedRequest] = {}
        self.not_started: set[str] = set()
        self.waiting: set[str] = set()
        self._figures = figures
        self._ended: float | None = None
        self._done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    @property
    def done(self) -> bool:
        return self._done.done()

    def __await__(self) -> Generator[Any, None, BatchOutcome]:
        yield from self._done.__await__()
        return self.outcome()

    def wait_for(self, key: str) -> None:
        self.waiting.add(key)

    def generated(self, result: GenerationResult, *, digest_tokens: int) -> None:
        """`result` is in the ledger; `digest_tokens`: the cache hit it was due (0: none)."""
        self.accumulator.add(result, digest_tokens=digest_tokens)
        self._settle(result.request_id)  # a ledger result's id is its content key

    def failed(self, failure: FailedRequest) -> None:
        self.failures[failure.request_id] = failure
        self._settle(failure.request_id)

    def not_sent(self, key: str) -> None:
        self.not_started.add(key)
        self._settle(key)

    def _settle(self, key: str) -> None:
        self.waiting.discard(key)
        self.finish_if_settled()

    def finish_if_settled(self) -> None:
        if not self.waiting and not self._done.done():
            self._ended = time.perf_counter()
            self._done.set_result(None)

    def abandon(self, error: BaseException) -> None:
        """The run ended without settling this submission: `await` raises `error`."""
        if self._done.done():
            return
        if isinstance(error, asyncio.CancelledError):
            self._done.cancel()
        else:
            self._done.set_exception(error)

    def planned_rows(self) -> list[PlannedRow]:
        """Each request's keys, in request order (whether the ledger had it when added)."""
        return [
            PlannedRow(
                request_id=p.request_id,
                content_key=p.content_key,
                input_id=p.request.input_id,
                tag=p.request.tag,
                from_ledger=p.content_key in self.before,
            )
            for p in self.planned
        ]

    def outcome(self) -> BatchOutcome:
        """Rows, failures and figures of these requests as they stand."""
        figures = self._figures()
        planned = self.planned
        # Failures are keyed by content; each input that asked for it gets its own entry.
        failures = [
            self.failures[p.content_key].model_copy(
                update={
                    "request_id": p.request_id,
                    "input_id": p.request.input_id,
                    "tag": p.request.tag,
                }
            )
            for p in planned
            if p.content_key in self.failures
        ]
        stats = self.accumulator.summary(
            total=len(self.unique),
            from_ledger=len(self.before),
            failed=len(self.failures),
            not_started=len(self.not_started),
            clamped=sum(1 for p in planned if p.params != p.request.params),
            digest_reprefills=figures.digest_reprefills,
            hangs=figures.hangs,
            max_in_flight=figures.max_in_flight,
            wall_s=(self._ended or time.perf_counter()) - self.started,
            in_flight_at_start=self.in_flight_at_start,
            digest_warmups=figures.digest_warmups,
            digest_restores=figures.digest_restores,
            own_digest_prefills=figures.own_digest_prefills,
            slot_saves_peak=figures.slot_saves_peak,
        )
        return BatchOutcome(
            model=figures.model,
            digest_sha256=figures.digest_sha256,
            planned=self.planned_rows(),
            failures=failures,
            stats=stats,
            warmups=figures.warmups,
            stopped_at_window=bool(self.not_started),
            not_sent=[
                FailedRequest(
                    request_id=p.request_id,
                    input_id=p.request.input_id,
                    tag=p.request.tag,
                    reason="not sent: the nightly window ended before it",
                    attempts=0,
                )
                for p in planned
                if p.content_key in self.not_started
            ],
        )


class Joined(Enum):
    """What a run does with a key a submission asks for."""

    NEW = "new"  # not seen in this run: queue it
    WAITING = "waiting"  # queued or in flight for an earlier submission: send it once
    SETTLED = "settled"  # failed or left unsent already in this run


class Settlements:
    """Every content key of a run settled once, and each submission waiting for it told."""

    def __init__(self) -> None:
        self.waiting: dict[str, list[Submission]] = {}
        self.failures: dict[str, FailedRequest] = {}
        self.not_started: set[str] = set()
        self._open: list[Submission] = []

    def track(self, submission: Submission) -> None:
        self._open = [s for s in self._open if not s.done]
        self._open.append(submission)

    def join(self, submission: Submission, key: str, *, past_stop: bool) -> Joined:
        """`submission` asks for `key` (not in the ledger when it was added)."""
        if key in self.failures:
            submission.failed(self.failures[key])
            return Joined.SETTLED
        submission.wait_for(key)
        if key in self.waiting:
            self.waiting[key].append(submission)
            return Joined.WAITING
        self.waiting[key] = [submission]
        if key in self.not_started or past_stop:
            self.not_sent(key)
            return Joined.SETTLED
        return Joined.NEW

    def generated(self, result: GenerationResult, *, digest_tokens: int) -> None:
        for submission in self.waiting.pop(result.request_id, ()):
            submission.generated(result, digest_tokens=digest_tokens)

    def failed(self, failure: FailedRequest) -> None:
        self.failures[failure.request_id] = failure
        for submission in self.waiting.pop(failure.request_id, ()):
            submission.failed(failure)

    def not_sent(self, key: str) -> None:
        self.not_started.add(key)
        for submission in self.waiting.pop(key, ()):
            submission.not_sent(key)

    def abandon(self, error: BaseException) -> None:
        """The run ended: whoever still waits gets `error`."""
        for submission in self._open:
            submission.abandon(error)
