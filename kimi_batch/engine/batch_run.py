"""One run of the engine: a worker per (endpoint, slot) pulls from the shared schedule, brings
the request's digest into its slot (`slot_digests`), sends (`send`), recovers between attempts
and restarts hung endpoints (`recover`), records each finished row in the ledger first
(`record`), and reports progress (`progress`).

A run stays open while its caller adds requests (`BatchRun.add`, one `submission.Submission`
each): a worker with nothing to take waits until more is added or the run is closed, so a
night's next stage of a partition joins the slots' queue while other partitions still generate.
Every content key is sent at most once a run, whichever submissions ask for it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from kimi_batch.engine.generation import GenerationRequest
from kimi_batch.engine.ledger import UnstorableResultError
from kimi_batch.engine.outcome import FailedRequest, PlannedRequest, distinct, lower_rank
from kimi_batch.engine.progress import ProgressReporter
from kimi_batch.engine.record import completion_result
from kimi_batch.engine.recover import Recovery
from kimi_batch.engine.schedule import Lane, PrefixSchedule
from kimi_batch.engine.send import TRANSIENT, InFlight, send_once
from kimi_batch.engine.slot_digests import SlotDigests
from kimi_batch.engine.stats import StatsAccumulator
from kimi_batch.engine.submission import Joined, RunFigures, Settlements, Submission
from kimi_batch.engine.warm import SlotWarmer, WarmupReport
from kimi_batch.engine.watchdog import EndpointWatch
from kimi_batch.llama import ChatCompletion, LlamaClient, LlamaError, LlamaRequestError

if TYPE_CHECKING:
    from kimi_batch.engine.batch_engine import BatchEngine

# The watchdog's key for a warm-up in flight (sends are keyed by their slot id, 0 up).
WARMUP_KEY = -1

logger = logging.getLogger(__name__)


def _prefix_text(item: PlannedRequest) -> str:
    """What the server sees after the digest, as far as prefix sharing goes."""
    return "\n".join(f"{m.role}\x00{m.content}" for m in item.request.messages)


def _work(item: PlannedRequest) -> int:
    """Rough token cost of a request: its generated tokens plus ~4 characters per prompt token."""
    return item.params.max_tokens + len(_prefix_text(item)) // 4


class BatchRun:
    """One run of the engine: requests are added while it runs (`add`), each set awaitable for
    its outcome; `close` says nothing more will come, and the run ends once all is settled."""

    def __init__(self, engine: BatchEngine, started: float, *, stop_at: datetime | None) -> None:
        self.engine = engine
        # Requests of one digest together, and those sharing a long prefix after it (variants
        # of one seed) back to back on one slot.
        self.schedule: PrefixSchedule[PlannedRequest] = PrefixSchedule(
            text=_prefix_text,
            work=_work,
            rank=lambda item: item.request.priority,
            kind=self._digest_sha,
        )
        self.slot_digests = SlotDigests(
            engine.digest,
            shared=self.schedule.is_shared,
            tokens=engine.tokens_of,
            prefill_timeout_s=lambda tokens: engine.speeds.deadline_s(tokens, 1),
            max_saves=engine.policy.slot_saves_max,
        )
        self.own_digest_prefills = 0
        self.total = 0
        self.stop_at = stop_at
        self.accumulator = StatsAccumulator(engine.digest_tokens)
        self.settled = Settlements()
        self.warmups: list[WarmupReport] = []
        self.watches: dict[LlamaClient, EndpointWatch] = {}
        self.recovery = Recovery(
            self.watches,
            engine.policy,
            on_unreachable=engine.on_unreachable,
            on_hung=engine.on_hung,
        )
        self.flight = InFlight()
        self.progress = ProgressReporter(engine.on_progress, total=0, started=started)
        self._recorded_reprefills = 0
        self.completion_tokens = 0
        self._queued: dict[str, PlannedRequest] = {}  # key → its item, until a worker takes it
        self._closed = False
        self._wake = asyncio.Event()

    @property
    def done(self) -> int:
        settled = self.settled
        return self.accumulator.generated + len(settled.failures) + len(settled.not_started)

    @property
    def reprefills(self) -> int:
        """Digest prefills paid again: by requests on a cold slot, and by re-warming."""
        return self._recorded_reprefills + self.recovery.reprefills

    @property
    def max_in_flight(self) -> int:
        return self.flight.peak

    def figures(self) -> RunFigures:
        digests = self.slot_digests
        return RunFigures(
            model=self.engine.model,
            digest_sha256=self.engine.digest.sha256,
            digest_reprefills=self.reprefills,
            hangs=sum(watch.hangs for watch in self.watches.values()),
            max_in_flight=self.max_in_flight,
            warmups=self.warmups,
            digest_warmups=digests.warmups,
            digest_restores=digests.restores,
            own_digest_prefills=self.own_digest_prefills,
            slot_saves_peak=digests.saves_peak,
        )

    def _digest_sha(self, item: PlannedRequest) -> str:
        return self.engine.digest_of(item.request).sha256

    def _past_stop(self) -> bool:
        return self.stop_at is not None and datetime.now(UTC) >= self.stop_at

    def add(self, requests: Sequence[GenerationRequest]) -> Submission:
        """Queue what the ledger and this run lack of `requests` (by rank, among the queued);
        `await` the result for their outcome. A request already queued or in flight is not
        sent again (it moves up to the lower rank), nor one done, failed or left unsent here.
        Requests with their own digest need `engine.count_digests(requests)` first."""
        if self._closed:
            raise RuntimeError("the run is closed: nothing more can be added")
        planned = self.engine.plan(requests)
        unique = distinct(planned)
        finished = self.engine.ledger.finished_keys(p.content_key for p in unique)
        submission = Submission(planned, finished, in_flight=self.flight.now, figures=self.figures)
        fresh: list[PlannedRequest] = []
        for item in (p for p in unique if p.content_key not in finished):
            joined = self.settled.join(submission, item.content_key, past_stop=self._past_stop())
            if joined is Joined.NEW:
                fresh.append(item)
            elif joined is Joined.WAITING:
                self._promote(item)
        logger.info(
            "batch: %d requests, %d already in the ledger, %d to generate",
            len(unique),
            len(finished),
            len(fresh),
        )
        for item in fresh:
            self._queued[item.content_key] = item
        self.schedule.add(fresh)
        self.slot_digests.queued(self._digest_sha(item) for item in fresh)
        self.total += len(fresh)
        self.progress.total = self.total
        self.settled.track(submission)
        submission.finish_if_settled()
        self._wake_workers()
        return submission

    def _promote(self, item: PlannedRequest) -> None:
        """A queued request asked again at a lower rank moves up to it."""
        queued = self._queued.get(item.content_key)
        if queued is None or item.request.priority >= queued.request.priority:
            return
        if self.schedule.withdraw(queued):
            promoted = lower_rank(queued, item.request.priority)
            self._queued[item.content_key] = promoted
            self.schedule.add([promoted])

    def close(self) -> None:
        """Nothing more will be added: the workers stop once the queue is empty."""
        self._closed = True
        self._wake_workers()

    def _wake_workers(self) -> None:
        self._wake.set()
        self._wake = asyncio.Event()

    async def _next(self, lane: Lane[PlannedRequest]) -> PlannedRequest | None:
        """The lane's next request, waiting for one while the run is open; None once closed."""
        while (item := lane.next()) is None and not self._closed:
            await self._wake.wait()
        if item is not None:
            self._queued.pop(item.content_key, None)
        return item

    async def execute(self, *, warm: bool) -> None:
        """Warm every slot once the first request is queued, then run a worker per slot until
        the run is closed and everything added is settled."""
        try:
            await self._execute(warm=warm)
        except BaseException as error:
            self.settled.abandon(error)
            raise
        self.settled.abandon(RuntimeError("the run ended before settling every request"))

    async def _execute(self, *, warm: bool) -> None:
        engine = self.engine
        clients = [engine.client_factory(e) for e in engine.endpoints]
        self.watches.update(
            {
                client: EndpointWatch(
                    client,
                    engine.policy.watchdog,
                    prompt_tok_s=lambda: engine.speeds.measured_prompt_tok_s,
                    batch_tokens=endpoint.batch_tokens,
                )
                for client, endpoint in zip(clients, engine.endpoints, strict=True)
            }
        )
        watchdog: asyncio.Task[None] | None = None
        try:
            warmers = [
                SlotWarmer(
                    client,
                    engine.digest,
                    digest_tokens=engine.digest_tokens,
                    model=endpoint.model,
                    ctx=endpoint.ctx,
                    prefill_timeout_s=engine.speeds.deadline_s(engine.digest_tokens, 1),
                    save_dir=endpoint.slot_save_dir,
                )
                for client, endpoint in zip(clients, engine.endpoints, strict=True)
            ]
            # The watchdog runs from the start: a server frozen during the digest restore is as
            # hung as one frozen mid-answer.
            watchdog = asyncio.create_task(self.recovery.watch())
            for warmer, endpoint in zip(warmers, engine.endpoints, strict=True):
                self.slot_digests.add_endpoint(endpoint, warmer)
            while not self.total and not self._closed:
                await self._wake.wait()  # no warm-up for a run that sends nothing
            # The engine's digest into every slot when its requests are queued (a Batch API
            # batch whose lines each bring their own system prompt warms none).
            if warm and self.slot_digests.remaining[engine.digest.sha256] and not self._past_stop():
                await self._warm_all(warmers)
            workers = [
                asyncio.create_task(self._worker(warmer, slot_id))
                for warmer, endpoint in zip(warmers, engine.endpoints, strict=True)
                for slot_id in range(endpoint.slots)
            ]
            await asyncio.gather(*workers)
        finally:
            if watchdog is not None:
                watchdog.cancel()
                # The rows are in the ledger: whatever ended the watchdog must not fail the batch.
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await watchdog
            self.slot_digests.close()  # the batch's own saves go, however it ended
            for client in clients:
                await client.aclose()
            engine.speeds.keep()  # the next step and the next run start from these
        self._report_progress(force=True)

    async def _warm_all(self, warmers: list[SlotWarmer]) -> None:
        for warmer, endpoint in zip(warmers, self.engine.endpoints, strict=True):
            report = await self._warm_watched(warmer, endpoint.slots)
            if report is not None:
                self.warmups.append(report)
                held = dict.fromkeys(range(endpoint.slots), self.engine.digest.sha256)
                self.watches[warmer.client].digests.update(held)

    async def _warm_watched(self, warmer: SlotWarmer, slots: int) -> WarmupReport | None:
        """The digest into every slot, watched like a request: a hung server is restarted and
        the warm-up begins again; one that fails otherwise leaves the slots cold (each request
        then restores or prefills the digest itself)."""
        watch = self.watches[warmer.client]
        attempts = self.engine.policy.attempts
        for attempt in range(1, attempts + 1):
            task = await watch.watched(WARMUP_KEY, warmer.warm_all(slots, verify=False))
            if task.cancelled():
                logger.warning(
                    "%s hung during the digest warm-up (attempt %d of %d); warming again",
                    watch.base_url,
                    attempt,
                    attempts,
                )
                continue
            error = task.exception()
            if error is None:
                report = task.result()
                if report.prefilled_slots:  # the longest prompt there is: a prompt speed
                    tokens = report.digest_tokens * len(report.prefilled_slots)
                    self.engine.speeds.observe_prompt(tokens, report.prefill_ms)
                return report
            if not isinstance(error, LlamaError):
                raise error
            logger.warning("digest warm-up of %s failed: %s", watch.base_url, error)
            if attempt < attempts:
                await self.recovery.before_warmup(warmer.client, error, attempt)
        logger.warning("%s: slots left cold; each request warms its own", watch.base_url)
        return None

    async def _worker(self, warmer: SlotWarmer, slot_id: int) -> None:
        lane = self.schedule.lane()
        while (item := await self._next(lane)) is not None:
            await self._process(warmer, slot_id, item)
            self.slot_digests.finished(self._digest_sha(item))

    async def _process(self, warmer: SlotWarmer, slot_id: int, item: PlannedRequest) -> None:
        """Send, recover between attempts, record: at most `policy.attempts` sends."""
        if self._past_stop():
            # The window closed: leave it for the next run (the ledger lacks it, so it resumes).
            self.settled.not_sent(item.content_key)
            return
        watch = self.watches[warmer.client]
        attempts = self.engine.policy.attempts
        digest = self.engine.digest_of(item.request)
        own = digest.sha256 != self.engine.digest.sha256
        reason = ""
        for attempt in range(1, attempts + 1):
            held = await self.slot_digests.bring(watch, slot_id, digest)
            sent = time.perf_counter()
            try:
                completion = await send_once(
                    watch,
                    slot_id,
                    item,
                    digest=digest,
                    deadline_s=self.engine.deadline_s(item, cold=not held),
                    flight=self.flight,
                )
            except LlamaRequestError as error:
                # The request itself is wrong (too long for the context, bad params): no retry.
                self._fail(item, f"rejected by the server: {error.message}", attempt)
                return
            except TRANSIENT as error:
                reason = f"{type(error).__name__}: {error}"
                logger.warning("request %s attempt %d failed: %s", item.request_id, attempt, reason)
                if attempt < attempts:
                    await self.recovery.before_retry(
                        warmer, slot_id, error, attempt, rewarm=not own
                    )
                continue
            except LlamaError as error:
                self._fail(item, f"{type(error).__name__}: {error}", attempt)
                return
            latency_ms = (time.perf_counter() - sent) * 1000
            # A one-off digest its request prefills (not held, by design): no cache hit due.
            prefilled_own = own and not held
            try:
                self._record(watch, slot_id, item, completion, latency_ms, prefilled_own)
            except UnstorableResultError as error:
                # An answer the ledger would not read back as it is (nothing was written): this
                # request fails with the reason, the batch goes on. Not retried: a server that
                # sent it once sends it again. The slot answered all the same: it holds this
                # request's digest now.
                watch.digests[slot_id] = digest.sha256
                watch.mark_progress()
                self._fail(item, str(error), attempt)
            return
        self._fail(item, reason, attempts)

    def _record(
        self,
        watch: EndpointWatch,
        slot_id: int,
        item: PlannedRequest,
        completion: ChatCompletion,
        latency_ms: float,
        prefilled_own: bool,
    ) -> None:
        engine = self.engine
        digest = engine.digest_of(item.request)
        result = completion_result(
            item,
            completion,
            model=engine.model,
            digest_sha256=digest.sha256,
            endpoint=watch.base_url,
            slot_id=slot_id,
            latency_ms=latency_ms,
        )
        engine.ledger.put(result)  # first: a kill from here on loses nothing
        tokens = engine.tokens_of(digest.sha256)
        expected_hit = 0 if prefilled_own else tokens
        self.accumulator.add(result, digest_tokens=expected_hit)
        engine.speeds.observe(result)
        self.completion_tokens += result.completion_tokens
        if prefilled_own:
            self.own_digest_prefills += 1
        elif result.cached_tokens < tokens:
            # This request paid a full digest prefill (an evicted or restarted slot). The
            # slot holds the digest again now; the count is what the bench reports.
            self._recorded_reprefills += 1
        watch.digests[slot_id] = digest.sha256
        watch.mark_progress()  # an answer is progress, whatever the probes say
        self.settled.generated(result, digest_tokens=expected_hit)
        self._report_progress()

    def _fail(self, item: PlannedRequest, reason: str, attempts: int) -> None:
        failure = FailedRequest(
            request_id=item.content_key,
            input_id=item.request.input_id,
            tag=item.request.tag,
            reason=reason,
            attempts=attempts,
        )
        self.settled.failed(failure)
        self._report_progress()

    def _report_progress(self, *, force: bool = False) -> None:
        self.progress.report(
            done=self.done,
            failed=len(self.settled.failures),
            completion_tokens=self.completion_tokens,
            watchdog="; ".join(dict.fromkeys(w.describe_stall() for w in self.watches.values())),
            force=force,
        )
