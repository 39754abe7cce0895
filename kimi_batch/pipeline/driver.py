"""The partition-batch driver: a sequence of stages over N held partitions, in one engine run.

`drive` runs its stages (an asset: its one; the nightly op: the night's) over the held
partitions as one pipeline on one open engine run (`BatchEngine.session`). It plans every
partition's first stage and adds its requests, the oldest partition first (a request's priority
is its partition's rank). As soon as a partition's requests of a stage are all settled, that
partition goes on by itself: what the stage asks again is sent again in the same run, the
partition is landed (`write_stage` below, then recorded: by the step, or at once) on the
landing thread, off the event loop, and its next stage is planned from what was just written and
added at the same rank. So the slots never drain between stages: a partition's distillation
joins the queue while later partitions still amplify, and a nightly window that closes early
leaves the oldest partitions whole. Each partition's result: landed through the last stage,
stopped at the nightly window (left for the next night, its finished rows in the ledger), or
failed (the error); a partition that stops or fails goes no further.

No Dagster here: the caller hands the driver a `DriverRun` (how a partition's stage is planned,
how the engine session opens, how a written partition is recorded, where lines are logged); the
Dagster adapter (`defs/assets/stage_asset.py`) is one. The Batch API's run adds `BatchControls`: its own plan of the batch's lines (`planner`), the
batch's expiry as a stop time past which what is done lands, a cancel poll, and a hook that hears
the planned keys before the first request is sent.

A partition is held under its lease (`partition_lease`: one run at a time generates and writes
a partition's tables); one this run cannot build (its input, its lease) is skipped by its own
exception (`PartitionSkippedError`) while the others go on.

The landing, no Dagster: a stage's partition landed: its rows and quarantine written under its lease, the
input version it consumed, its data version, and the figures its record carries.

`write_stage` writes a planned partition's rows (through the quality gate when the stage is
gated and the gate on: contamination and duplicates set aside, the kept rows indexed under the
lease once the block ends) and its quarantine. A commit is the publication: Trino, polars and
pyiceberg read the tables' catalog and see it on their next query, so nothing is registered
after it. The Dagster adapter (`defs/assets/stage_asset.py`) judges the checks and records it.

A stage's partition has a data version (`stage_data_version`) made from what determines its
rows: its input version and its requests' identities (the ledger answers each request once), so
a partition built twice from the same input by the same stage carries the same version, whichever
run built it.

`StageSink`: where a stage's results go, and the one owner of what they leave behind.

The sink drives the stage's `parse` over the results as they stream from the ledger, passes the
rows on (to the Parquet writer), and keeps everything else itself: the quarantine rows (outputs
set aside, requests that failed) and the figures the asset checks judge. Nothing is held but
those: the rows are never collected.

The checks every generation stage's partition is judged by, no Dagster: their names and their
verdicts (the Dagster adapter turns them into asset check results).

`truncation_rate` fails above `TRUNCATION_FAIL_RATE` (those answers are set aside, so most of the
work would be in quarantine). A quality-gated stage's partition (the teacher's answers) carries
two more: `benchmark_contamination` fails above `KIMI_BATCH_CONTAMINATION_MAX_RATE` (the inputs
overlap what the student is evaluated on) and `duplicate_rate` warns when most of a partition
repeats earlier nights (an input dropped again under another name, say). The rows are in
quarantine either way: the checks tell a person, the gate already kept them out.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections import Counter
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import polars as pl
from pydantic import BaseModel, ConfigDict

from kimi_batch.crash_points import crash_point
from kimi_batch.engine import (
    BatchOutcome,
    BatchRun,
    FailedRequest,
    GenerationRequest,
    GenerationResult,
    Lease,
    LeaseHeldError,
    LeaseLostError,
    Ledger,
    PlannedRow,
)
from kimi_batch.errors import KimiBatchError
from kimi_batch.pipeline.generation_task import GenerationTask, RowReader, SetAside
from kimi_batch.pipeline.rows import (
    INPUT_STAGE,
    GenerationColumns,
    QuarantineRow,
    failure_rows,
    result_row,
)

if TYPE_CHECKING:
    # Types only: the warehouse's row schemas build on this package's row models, so importing
    # the warehouse while this module loads would be an import cycle.
    from kimi_batch.quality import PartitionGate, QualityGate
    from kimi_batch.warehouse import PartitionWrite, Warehouse

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
    the first is sent. `land_at_window`: a run that records what a night landed (a partition's
    version run): past the window its unsent requests land as failed ("not sent"), as the
    night's failed ones did, instead of the partition waiting for the next night.
    """

    expires_at: datetime | None = None
    cancelled: Callable[[], bool] | None = None
    on_planned: Callable[[Sequence[PlannedRow]], None] | None = None
    land_at_window: bool = False

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


# ---- why a partition is skipped -----------------------------------------------------------------


class PartitionSkippedError(KimiBatchError):
    """A partition this run cannot build (its input, its lease): this run leaves it alone, the
    others go on. The Dagster adapter fails the asset's step with it (`dg.Failure`); the night
    names it among the partitions that failed."""


# What leaves one partition out while the others go on (its input, its lease, a write refused).
SKIPPED = (PartitionSkippedError, LeaseLostError, KimiBatchError)


class StageConfigError(KimiBatchError):
    """A stage's run config names what cannot be used (an output model the deployment does not
    allow, a rubric that cannot be read): the run builds nothing."""


# ---- the partition's lease ----------------------------------------------------------------------


# A lease lives this long without its holder's heartbeat: a killed run frees its partition then.
LEASE_TTL_S = 60.0
# A second run on the same partition waits this long, longer than a dead holder's lease can last,
# then leaves a live holder the partition (it writes every row; a second run would only repeat).
LEASE_WAIT_S = LEASE_TTL_S + 30.0


@dataclass(frozen=True)
class HeldPartition:
    """The ledger, and the lease this run holds on the partition: the fence of every Parquet
    write (`guard=held.lease`), `check` before the other writes."""

    ledger: Ledger
    lease: Lease

    def check(self) -> None:
        """Raises LeaseLostError when another run has taken the partition over."""
        self.lease.check()


@contextmanager
def partition_lease(
    ledgers: Callable[[], Ledger], ds: str, source: str, holder: str
) -> Iterator[HeldPartition]:
    """Hold the partition (generation and every write of its tables) for run `holder`, on a
    ledger `ledgers()` opens; a partition another run holds, or a lease lost on the way (this
    run stalled past its ttl), is `PartitionSkippedError` instead of a write."""
    with ledgers() as ledger:
        lease = ledger.lease(f"{ds}|{source}", holder, ttl_s=LEASE_TTL_S, wait_s=LEASE_WAIT_S)
        try:
            held = lease.__enter__()
        except LeaseHeldError as error:
            raise PartitionSkippedError(
                f"partition {ds}|{source} is being written by another run ({error}); "
                "this run leaves it alone"
            ) from error
        try:
            yield HeldPartition(ledger=ledger, lease=held)
        except LeaseLostError as error:
            raise PartitionSkippedError(str(error)) from error
        finally:
            lease.__exit__(None, None, None)


# ---- the driver ---------------------------------------------------------------------------------


Task = GenerationTask[Any, Any]
LandedT = TypeVar("LandedT")
LandedT_co = TypeVar("LandedT_co", covariant=True)


@dataclass(frozen=True)
class StagePlan:
    """One partition of one stage before generation: its inputs, requests and input version."""

    task: Task
    ds: str
    source: str
    inputs: Any
    requests: list[GenerationRequest]
    input_sha: str


@dataclass(frozen=True)
class PipelineStage:
    """One stage a driver run takes its partitions through: its asset and its task."""

    asset: str
    task: Task


@dataclass(frozen=True)
class PartitionResult(Generic[LandedT]):
    """What became of one partition: landed through the last stage (`materialized`: that
    stage's record, `outcome`: its share of the run), `stopped` at the nightly window (the
    stage's outcome), or `failed` (why)."""

    key: str
    materialized: LandedT | None = None
    stopped: BatchOutcome | None = None
    failed: BaseException | None = None
    outcome: BatchOutcome | None = None


class DriverRun(Protocol[LandedT_co]):
    """What the driver's caller provides: the plan of a partition's stage, the engine session,
    the landing of a partition's stage (its rows written, then recorded), the log."""

    def log(self, message: str) -> None: ...

    def plan(self, task: Task, key: str) -> StagePlan: ...

    def session(self, label: str) -> AbstractAsyncContextManager[BatchRun]: ...

    def land(
        self,
        asset: str,
        key: str,
        plan: StagePlan,
        held: HeldPartition,
        outcome: BatchOutcome,
        results: Iterable[GenerationResult],
    ) -> LandedT_co: ...


def split_partition_key(raw: str) -> tuple[str, str] | None:
    """(ds, source) of a `date|source` key string; None for a key of another shape."""
    # Dagster joins a multi-partition key's dimensions in name order: date, then source.
    parts = raw.split("|")
    return (parts[0], parts[1]) if len(parts) == 2 and all(parts) else None


def partition_parts_of(key: str) -> tuple[str, str]:
    """(ds, source) of a `date|source` key a run has already checked."""
    parts = split_partition_key(key)
    if parts is None:
        raise ValueError(f"not a date|source partition key: {key!r}")
    return parts


def sample_scope(task: Task, ds: str, source: str) -> str:
    """Where a stage's input rows live: a request that samples (not greedy, no fixed seed) is
    this partition's own, apart from the same request asked in another partition or stage."""
    return f"{task.name}|{ds}|{source}"


def plan_partition(task: Task, read: RowReader, ds: str, source: str, input_sha: str) -> StagePlan:
    """The partition's inputs of `task` (`read` of its upstream tables) and its requests, each
    row its own sample; `input_sha`: the landed input version they were built from."""
    inputs = task.load(read)
    scope = sample_scope(task, ds, source)
    return StagePlan(
        task=task,
        ds=ds,
        source=source,
        inputs=inputs,
        requests=[r.model_copy(update={"sample_scope": scope}) for r in task.requests(inputs)],
        input_sha=input_sha,
    )


def oldest_first(keys: Iterable[str]) -> dict[str, int]:
    """Each checked `date|source` key's rank (0 = the oldest day), whatever order the run's
    config lists them in; a request several partitions share goes out at the lowest."""
    return {key: rank for rank, key in enumerate(sorted(keys, key=partition_parts_of))}


async def drive(
    run: DriverRun[LandedT],
    stages: Sequence[PipelineStage],
    partitions: Mapping[str, HeldPartition],
    *,
    lands: Executor,
    label: str,
    controls: BatchControls | None = None,
) -> dict[str, PartitionResult[LandedT]]:
    """`stages` over every held partition (key -> lease) in one engine session, each partition
    landed stage by stage on `lands` (one thread: off the event loop, one partition at a time);
    every partition's result (see the module docstring)."""
    driver = _Driver(run, lands, oldest_first(partitions), controls or BatchControls())
    return await driver.run(stages, partitions, label)


def drive_on(
    loop: Callable[[Coroutine[Any, Any, dict[str, PartitionResult[LandedT]]]], Any],
    run: DriverRun[LandedT],
    stages: Sequence[PipelineStage],
    partitions: Mapping[str, HeldPartition],
    controls: BatchControls,
) -> dict[str, PartitionResult[LandedT]]:
    """`drive` run to its end by `loop` (an event loop's `run`: the caller's, which a terminated
    run stops), with one landing thread and the cancel poll of `controls`; every partition's
    result, in `partitions`' order."""
    names = ", ".join(stage.asset for stage in stages)
    label = f"{names} " + (
        next(iter(partitions)) if len(partitions) == 1 else f"({len(partitions)} partitions)"
    )
    # One landing thread: the tables, checks and records off the event loop, one at a time.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="landing") as lands:
        try:
            work = drive(run, stages, partitions, lands=lands, label=label, controls=controls)
            cancelled = controls.cancelled
            results = loop(work if cancelled is None else unless_cancelled(work, cancelled))
        finally:
            lands.shutdown(cancel_futures=True)  # an interrupted run starts no more landings
    return {key: results[key] for key in partitions}


@dataclass(frozen=True)
class _Driver(Generic[LandedT]):
    """One `drive` call: what its partitions' pipelines share."""

    hooks: DriverRun[LandedT]
    lands: Executor
    ranks: Mapping[str, int]
    controls: BatchControls = field(default_factory=BatchControls)

    async def run(
        self, stages: Sequence[PipelineStage], partitions: Mapping[str, HeldPartition], label: str
    ) -> dict[str, PartitionResult[LandedT]]:
        first = {key: self._plan(stages[0].task, key) for key in partitions}
        if not any(isinstance(plan, StagePlan) for plan in first.values()):
            return {key: self._result(key, first[key]) for key in partitions}  # nothing to send
        async with self.hooks.session(label) as run:
            pipelines = [
                asyncio.create_task(self._partition(run, key, held, stages, first[key]))
                for key, held in partitions.items()
            ]
            try:
                results = await asyncio.gather(*pipelines)
            finally:
                for pipeline in pipelines:  # one that raised ends the others
                    pipeline.cancel()
        return dict(zip(partitions, results, strict=True))

    def _plan(self, task: Task, key: str) -> StagePlan | BaseException:
        try:
            return self.hooks.plan(task, key)
        except SKIPPED as error:
            return error

    @staticmethod
    def _result(key: str, plan: StagePlan | BaseException) -> PartitionResult[LandedT]:
        return PartitionResult(key, failed=plan if isinstance(plan, BaseException) else None)

    async def _off_loop(self, call: Callable[[], T]) -> T:
        """`call` on the landing thread: the slots keep generating meanwhile."""
        return await asyncio.get_running_loop().run_in_executor(self.lands, call)

    async def _partition(
        self,
        run: BatchRun,
        key: str,
        held: HeldPartition,
        stages: Sequence[PipelineStage],
        plan: StagePlan | BaseException,
    ) -> PartitionResult[LandedT]:
        """The partition through every stage, each planned from what the last one wrote."""
        result = self._result(key, plan)
        for index, stage in enumerate(stages):
            if index:
                plan = await self._off_loop(partial(self._plan, stage.task, key))
            if isinstance(plan, BaseException):
                return self._result(key, plan)
            result = await self._stage(run, stage.asset, key, held, plan)
            if result.materialized is None:
                return result
        return result

    async def _stage(
        self, run: BatchRun, asset: str, key: str, held: HeldPartition, plan: StagePlan
    ) -> PartitionResult[LandedT]:
        """One partition's stage: its requests at its rank, what it asks again, its landing."""
        outcome = await self._add(run, key, plan.requests, planned=self.controls.on_planned)
        self._log(asset, key, outcome)
        if self._stopped(outcome):
            return PartitionResult(key, stopped=outcome)
        results: Iterable[GenerationResult] | None = None
        if plan.task.asks_again:
            again = await self._off_loop(partial(asked_again, held.ledger, plan, outcome))
            self.hooks.log(
                f"asking again for {len(again)} answer(s) of the {plan.task.name} stage ({key})"
            )
            if again:
                retried = await self._add(run, key, list(again.values()))
                if self._stopped(retried):
                    return PartitionResult(key, stopped=retried)
                results = answered_again(held.ledger, outcome, again, retried)
        land = partial(self._land, asset, key, plan, held, outcome, results)
        return await self._off_loop(land)

    async def _add(
        self,
        run: BatchRun,
        key: str,
        requests: Sequence[GenerationRequest],
        *,
        planned: Callable[[Sequence[PlannedRow]], None] | None = None,
    ) -> BatchOutcome:
        """`requests` at the partition's rank; `planned` hears their keys before any is sent."""
        ranked = [r.model_copy(update={"priority": self.ranks[key]}) for r in requests]
        await run.engine.count_digests(ranked)  # a Batch API line's own system prompt
        submission = run.add(ranked)
        if planned is not None:
            planned(submission.planned_rows())
        return await submission

    def _stopped(self, outcome: BatchOutcome) -> bool:
        """Cut short by the nightly window (left for the next night); one the work's own end
        cut short lands what it has (it is never resumed)."""
        if self.controls.land_at_window:
            return False
        return outcome.stopped_at_window and not self.controls.expired()

    def _log(self, asset: str, key: str, outcome: BatchOutcome) -> None:
        stats = outcome.stats
        self.hooks.log(
            f"{asset} {key}: {stats.generated} generated, {stats.from_ledger} "
            f"from the ledger, {stats.failed} failed, {stats.not_started} not started, "
            f"{stats.in_flight_at_start} in flight when it joined, max {stats.max_in_flight}"
        )

    def _land(
        self,
        asset: str,
        key: str,
        plan: StagePlan,
        held: HeldPartition,
        outcome: BatchOutcome,
        results: Iterable[GenerationResult] | None,
    ) -> PartitionResult[LandedT]:
        """The partition's rows of the stage landed (on the landing thread: it reads the
        results through the partition's own ledger)."""
        rows = results if results is not None else outcome.iter_results(held.ledger)
        if outcome.stopped_at_window and self.controls.land_at_window:
            outcome = outcome.model_copy(
                update={"failures": [*outcome.failures, *outcome.not_sent]}
            )
        try:
            landed = self.hooks.land(asset, key, plan, held, outcome, rows)
        except SKIPPED as error:
            return PartitionResult(key, failed=error)
        return PartitionResult(key, materialized=landed, outcome=outcome)


def asked_again(
    ledger: Ledger, plan: StagePlan, outcome: BatchOutcome
) -> dict[str, GenerationRequest]:
    """The requests the stage asks again, by the request id of the answer each would replace."""
    task, requests = plan.task, plan.requests
    by_id = {row.request_id: req for row, req in zip(outcome.planned, requests, strict=True)}
    again: dict[str, GenerationRequest] = {}
    for result in outcome.iter_results(ledger):
        retry = task.retry(by_id[result.request_id], result)
        if retry is not None:
            again[result.request_id] = retry
    return again


def answered_again(
    ledger: Ledger,
    outcome: BatchOutcome,
    again: Mapping[str, GenerationRequest],
    retried: BatchOutcome,
) -> Iterator[GenerationResult]:
    """The first answers in request order, each one asked `again` replaced by its new answer
    where `retried` has one."""
    replacements = {(r.input_id, r.tag): r for r in retried.iter_results(ledger)}
    for result in outcome.iter_results(ledger):
        replaced = replacements.get((result.input_id, result.tag))
        yield replaced if replaced is not None and result.request_id in again else result


# ---- `StageSink`: where a stage's results go ----------------------------------------------------


InputsT = TypeVar("InputsT")
RowT = TypeVar("RowT", bound=GenerationColumns)


class CheckFigures(BaseModel):
    """What the checks of one landed partition are judged on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    results: int
    truncated: int
    empty: int
    rows: int
    duplicate_request_ids: int

    @property
    def truncation_rate(self) -> float:
        return self.truncated / self.results if self.results else 0.0


class StageSink(Generic[InputsT, RowT]):
    """One stage run's results in, rows out; quarantine rows and figures kept here."""

    def __init__(
        self, task: GenerationTask[InputsT, RowT], inputs: InputsT, *, input_sha256: str = ""
    ) -> None:
        self._task = task
        self._inputs = inputs
        # The landed input version the inputs were built from: every row and set-aside carries it.
        self._input_sha256 = input_sha256
        self._quarantined: list[QuarantineRow] = []
        self._results = self._truncated = self._empty = 0
        self._parsed = self._rows = self._duplicates = 0
        self._ids: set[str] = set()
        self._sums: Counter[str] = Counter()

    def rows(self, results: Iterable[GenerationResult]) -> Iterator[RowT]:
        """The stage's rows of `results`, one at a time; set-asides stay in the sink."""
        for row in self._task.keep(
            self._parse(self._task.order(self._count(results))), self._inputs
        ):
            self._rows += 1
            self._duplicates += row.request_id in self._ids
            self._ids.add(row.request_id)
            self._sums.update(self._task.measure(row))
            yield row.model_copy(update={"input_sha256": self._input_sha256})

    def _count(self, results: Iterable[GenerationResult]) -> Iterator[GenerationResult]:
        for result in results:
            self._results += 1
            self._truncated += result.truncated
            self._empty += result.empty
            yield result

    def _parse(self, results: Iterable[GenerationResult]) -> Iterator[RowT]:
        for result in results:
            parsed = self._task.parse(result, self._inputs)
            if isinstance(parsed, SetAside):
                self._quarantined.append(
                    result_row(
                        result,
                        stage=self._task.name,
                        source_file=parsed.source_file,
                        line=parsed.line,
                        reason=parsed.reason,
                    )
                )
                continue
            self._parsed += 1
            yield parsed

    def failed(
        self,
        failures: Sequence[FailedRequest],
        *,
        source_file: str,
        model: str,
        digest_sha: str,
        created_at: datetime,
    ) -> None:
        """Requests that failed after every attempt, as quarantine rows (a rerun retries them)."""
        self._quarantined.extend(
            failure_rows(
                failures,
                stage=self._task.name,
                source_file=source_file,
                model=model,
                digest_sha=digest_sha,
                created_at=created_at,
            )
        )

    @property
    def quarantined(self) -> list[QuarantineRow]:
        """Outputs set aside (in the order they were parsed), then failed requests."""
        sha = self._input_sha256 or None
        return [row.model_copy(update={"input_sha256": sha}) for row in self._quarantined]

    @property
    def dropped(self) -> int:
        """Parsed rows the stage's `keep` left out (e.g. duplicates)."""
        return self._parsed - self._rows

    def figures(self) -> CheckFigures:
        return CheckFigures(
            results=self._results,
            truncated=self._truncated,
            empty=self._empty,
            rows=self._rows,
            duplicate_request_ids=self._duplicates,
        )

    def metadata(self) -> dict[str, float]:
        """The stage's own figures for the materialization (e.g. duplicates dropped, scores)."""
        metric = self._task.dropped_metric
        dropped = {metric: self.dropped} if metric else {}
        return {**dropped, **self._task.summarize(self._sums, self._rows)}


# ---- the checks a partition is judged by --------------------------------------------------------


TRUNCATION_CHECK = "truncation_rate"
# The quality-gated stages' share of rows sharing an n-gram with a benchmark (fails above the
# configured rate), and of rows repeating kept ones (warns; not an alert: they are set aside).
CONTAMINATION_CHECK = "benchmark_contamination"
DUPLICATE_CHECK = "duplicate_rate"
CHECK_NAMES = (
    "no_duplicate_request_ids",
    TRUNCATION_CHECK,
    "no_empty_outputs",
    "matches_table_schema",
)
# Above this share of answers cut off at max_tokens the truncation check fails (ERROR): those
# answers are set aside, so most of the night's work would be in quarantine.
TRUNCATION_FAIL_RATE = 0.25
# Above this share of a partition's rows repeating kept ones, `duplicate_rate` warns.
DUPLICATE_WARN_RATE = 0.5


@dataclass(frozen=True)
class CheckVerdict:
    """One check of one partition: passed or not, what it saw; `warn`: a warning, not an error."""

    name: str
    passed: bool
    metadata: dict[str, Any] = field(default_factory=dict)
    warn: bool = False


def stage_check_names(task: type[GenerationTask[Any, Any]]) -> tuple[str, ...]:
    """The checks a stage's partition is judged by: every stage's, and the gate's when gated."""
    gated = (CONTAMINATION_CHECK, DUPLICATE_CHECK) if task.quality_gated else ()
    return (*CHECK_NAMES, *gated)


def generation_verdicts(
    table: str, figures: CheckFigures, written: Mapping[str, pl.DataType]
) -> list[CheckVerdict]:
    """Duplicate request ids, truncation rate (fails above TRUNCATION_FAIL_RATE), empty outputs
    (set aside included), and schema."""
    from kimi_batch.warehouse import polars_schema  # not at the top: see the imports

    expected = polars_schema(table)
    return [
        CheckVerdict(
            "no_duplicate_request_ids",
            figures.duplicate_request_ids == 0,
            {"duplicates": figures.duplicate_request_ids},
        ),
        CheckVerdict(
            TRUNCATION_CHECK,
            figures.truncation_rate <= TRUNCATION_FAIL_RATE,
            {
                "truncated": figures.truncated,
                "rate": round(figures.truncation_rate, 3),
                "threshold": TRUNCATION_FAIL_RATE,
            },
        ),
        CheckVerdict("no_empty_outputs", figures.empty == 0, {"empty": figures.empty}, warn=True),
        CheckVerdict(
            "matches_table_schema",
            dict(written) == dict(expected),
            {"columns": len(written), "expected_columns": len(expected)},
        ),
    ]


def quality_verdicts(screen: PartitionGate | None, gate: QualityGate) -> list[CheckVerdict]:
    """The partition's contamination and duplicate checks (passed, saying so, when the gate is
    off: every gated stage's partition reports both)."""
    if screen is None:
        off = {"gate": "off (KIMI_BATCH_DEDUP off, no KIMI_BATCH_BENCHMARKS)"}
        return [
            CheckVerdict(name, True, dict(off)) for name in (CONTAMINATION_CHECK, DUPLICATE_CHECK)
        ]
    counts = screen.counts
    max_rate = gate.settings.contamination_max_rate
    contamination = CheckVerdict(
        CONTAMINATION_CHECK,
        counts.contamination_rate <= max_rate,
        {
            "contaminated": counts.contaminated,
            "screened": counts.screened,
            "rate": round(counts.contamination_rate, 4),
            "max_rate": max_rate,
            "benchmarks": ", ".join(screen.benchmark_files) or "none configured",
        },
    )
    duplicates = CheckVerdict(
        DUPLICATE_CHECK,
        counts.duplicate_rate <= DUPLICATE_WARN_RATE,
        {
            "duplicates": counts.duplicates,
            "near_duplicates": counts.near_duplicates,
            "screened": counts.screened,
            "rate": round(counts.duplicate_rate, 4),
            "warn_rate": DUPLICATE_WARN_RATE,
            "dedup": "on" if screen.dedup else "off",
        },
        warn=True,
    )
    return [contamination, duplicates]


# ---- the landing --------------------------------------------------------------------------------


@dataclass(frozen=True)
class StageWrite:
    """A partition's rows and quarantine, written: what its checks and record are made of."""

    written: PartitionWrite
    quarantined: int
    sink: StageSink[Any, Any]
    screen: PartitionGate | None


@contextmanager
def screening(
    gate: QualityGate | None,
    store: Warehouse,
    task: Task,
    inputs: Any,
    partition: tuple[str, str],
    held: HeldPartition,
) -> Iterator[PartitionGate | None]:
    """The partition's screening when its stage is gated and the gate on (else None); its kept
    rows are indexed, under its lease, when the block ends without an error."""
    if gate is None or not gate.screens(task):
        yield None
        if gate is not None and task.quality_gated:
            gate.release(*partition)  # landed unscreened: its old index entries must not answer
        return
    ds, source = partition
    with gate.partition(store, task, inputs, ds, source, guard=held.check) as screen:
        yield screen


def write_stage(
    plan: StagePlan,
    held: HeldPartition,
    outcome: BatchOutcome,
    results: Iterable[GenerationResult],
    *,
    store: Warehouse,
    gate: QualityGate | None = None,
) -> StageWrite:
    """Write the partition's rows (screened by `gate`) and its quarantine (lease held)."""
    task, ds, source = plan.task, plan.ds, plan.source
    sink = StageSink(task, plan.inputs, input_sha256=plan.input_sha)
    with screening(gate, store, task, plan.inputs, (ds, source), held) as screen:
        rows = sink.rows(results)
        written = store.write_partition(
            task.table, ds, source, screen.admit(rows) if screen else rows, guard=held.lease
        )
        crash_point("stage.rows_written")
        sink.failed(
            outcome.failures,
            source_file=source,
            model=outcome.model,
            digest_sha=outcome.digest_sha256,
            created_at=datetime.now(UTC),
        )
        set_aside = [*sink.quarantined, *(screen.quarantined if screen else ())]
        quarantined = store.replace_quarantine(ds, source, task.name, set_aside, guard=held.lease)
    return StageWrite(written=written, quarantined=quarantined, sink=sink, screen=screen)


def stage_data_version(plan: StagePlan, outcome: BatchOutcome) -> str:
    """The partition's data version: its table, input version, and the ids of the requests its
    rows come from and of those that failed (each id names a ledger key: digest, model, params,
    messages, sample), so the same input through the same stage gives the same version."""
    digest = hashlib.sha256(f"{plan.task.table}\n{plan.input_sha}\n".encode())
    for request_id in sorted(row.request_id for row in outcome.planned):
        digest.update(f"{request_id}\n".encode())
    for request_id in sorted(failure.request_id for failure in outcome.failures):
        digest.update(f"failed {request_id}\n".encode())
    return digest.hexdigest()


def consumed_input_sha(store: Warehouse, ds: str, source: str) -> str:
    """The landed input version the partition's `seeds` were built from ("" before any).

    A file of only bad lines leaves no seed row: the version is then its input quarantine rows'
    (every line set aside is stamped with it), so the partition consumed its input, its outputs
    are empty, and it is not stale the next night.
    """
    shas = store.read_partition("seeds", ds, source).get_column("input_sha256").drop_nulls()
    if shas.is_empty():
        set_aside = store.read_partition("quarantine", ds, source)
        shas = set_aside.filter(pl.col("stage") == INPUT_STAGE).get_column("input_sha256")
        shas = shas.drop_nulls()
    return str(shas.unique().sort()[-1]) if len(shas) else ""


def plan_stage(task: Task, store: Warehouse, ds: str, source: str) -> StagePlan:
    """Read the partition's inputs of `task` from the warehouse and build its requests."""
    read: RowReader = lambda table, model: store.read_rows(table, ds, source, model)  # noqa: E731
    return plan_partition(task, read, ds, source, consumed_input_sha(store, ds, source))


def generation_figures(outcome: BatchOutcome) -> dict[str, float | int | str]:
    """The engine's figures of one batch: tok/s to 0.1, ms to 1, ratios to 0.001."""
    stats = outcome.stats
    return {
        "requests": stats.total,
        "generated": stats.generated,
        "from_ledger": stats.from_ledger,
        "failures": stats.failed,
        "not_started": stats.not_started,
        "truncated": stats.truncated,
        "completion_tokens": stats.completion_tokens,
        "cached_tokens": stats.cached_tokens,
        "prompt_tokens_per_s": round(stats.prompt_tokens_per_s, 1),
        "completion_tokens_per_s": round(stats.completion_tokens_per_s, 1),
        "cache_hit_ratio": round(stats.cache_hit_ratio, 3),
        "digest_reprefills": stats.digest_reprefills,
        "server_hangs": stats.hangs,
        "latency_p50_ms": round(stats.latency_p50_ms, 0),
        "latency_p95_ms": round(stats.latency_p95_ms, 0),
        "max_in_flight": stats.max_in_flight,
        "in_flight_at_start": stats.in_flight_at_start,
        "wall_s": round(stats.wall_s, 1),
        "digest_sha256": outcome.digest_sha256[:12],
        "digest_sha256_full": outcome.digest_sha256,
    }


_SUMMARY_KEYS = (
    ("rows", "rows"),
    ("quarantined", "quarantined"),
    ("generated", "generated"),
    ("from_ledger", "from the ledger"),
    ("completion_tokens_per_s", "tok/s"),
    ("cache_hit_ratio", "cache hit"),
    ("latency_p95_ms", "p95 latency (ms)"),
    ("wall_s", "wall (s)"),
)


def summary_markdown(figures: Mapping[str, object]) -> str:
    """The headline figures of a materialization as a Markdown table."""
    lines = ["| figure | value |", "| --- | --- |"]
    lines += [f"| {label} | {figures[key]} |" for key, label in _SUMMARY_KEYS if key in figures]
    return "\n".join(lines)
