"""The partition-batch driver: a sequence of stages over N held partitions, in one engine run.

`run_partitions` runs its stages (an asset: its one; the nightly op: the night's) over the held
partitions as one pipeline on one open engine run (`BatchEngine.session`). It plans every
partition's first stage and adds its requests, the oldest partition first (a request's priority
is its partition's rank). As soon as a partition's requests of a stage are all settled, that
partition goes on by itself: what the stage asks again is sent again in the same run, the
partition is landed (`landing.land_stage`, then its `Landing`: recorded by the step, or at once) on the
landing thread, off the event loop, and its next stage is planned from what was just written and
added at the same rank. So the slots never drain between stages: a partition's distillation
joins the queue while later partitions still amplify, and a nightly window that closes early
leaves the oldest partitions whole. Each partition's result: landed through the last stage,
stopped at the nightly window (left for the next night, its finished rows in the ledger), or
failed (the error); a partition that stops or fails goes no further.

The Batch API's run adds `BatchControls`: its own plan of the batch's lines (`planner`), the
batch's expiry as a stop time past which what is done lands, a cancel poll, and a hook that hears
the planned keys before the first request is sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import dagster as dg

from kimi_batch.defs.assets.batch_controls import (
    BatchControls,
    unless_cancelled,
)
from kimi_batch.defs.assets.context import RunContext
from kimi_batch.defs.assets.engine_session import engine_session
from kimi_batch.defs.assets.landing import (
    Landing,
    StagePlan,
    consumed_input_sha,
    land_stage,
    partition_parts_of,
)
from kimi_batch.defs.interrupts import run_interruptibly
from kimi_batch.defs.resources.digest import DigestResource
from kimi_batch.defs.resources.llama import LlamaServerResource
from kimi_batch.defs.resources.trino import TrinoResource
from kimi_batch.defs.resources.warehouse import WarehouseResource
from kimi_batch.engine import (
    BatchOutcome,
    BatchRun,
    GenerationRequest,
    GenerationResult,
    Ledger,
    PlannedRow,
)
from kimi_batch.pipeline import SKIPPED, GenerationTask, HeldPartition, RowReader
from kimi_batch.settings import Settings
from kimi_batch.warehouse import Warehouse

__all__ = [
    "GenerationResources",
    "PartitionResult",
    "PipelineStage",
    "answered_again",
    "asked_again",
    "oldest_first",
    "plan_stage",
    "run_partitions",
    "sample_scope",
]

Task = GenerationTask[Any, Any]
T = TypeVar("T")
# A partition's plan of a stage (default `plan_stage`: its inputs read from the warehouse).
Planner = Callable[[Task, str], StagePlan]


@dataclass(frozen=True)
class GenerationResources:
    """The resources a stage's run uses, as one bundle."""

    llama: LlamaServerResource
    digest: DigestResource
    warehouse: WarehouseResource
    trino: TrinoResource

    @property
    def settings(self) -> Settings:
        """The deployment's one `Settings`, which every resource holds."""
        return self.llama.settings()


@dataclass(frozen=True)
class PipelineStage:
    """One stage a driver run takes its partitions through: its asset and its task."""

    asset: dg.AssetKey
    task: Task


@dataclass(frozen=True)
class PartitionResult:
    """What became of one partition: landed through the last stage (`materialized`: that
    stage's result, `outcome`: its share of the run), `stopped` at the nightly window (the
    stage's outcome), or `failed` (why)."""

    key: str
    materialized: dg.MaterializeResult | None = None
    stopped: BatchOutcome | None = None
    failed: BaseException | None = None
    outcome: BatchOutcome | None = None


def sample_scope(task: Task, ds: str, source: str) -> str:
    """Where a stage's input rows live: a request that samples (not greedy, no fixed seed) is
    this partition's own, apart from the same request asked in another partition or stage."""
    return f"{task.name}|{ds}|{source}"


def plan_stage(task: Task, store: Warehouse, ds: str, source: str) -> StagePlan:
    """Read the partition's inputs of `task` and build its requests (each row its own sample)."""
    reader: RowReader = lambda table, model: store.read_rows(table, ds, source, model)  # noqa: E731
    inputs = task.load(reader)
    scope = sample_scope(task, ds, source)
    return StagePlan(
        task=task,
        ds=ds,
        source=source,
        inputs=inputs,
        requests=[r.model_copy(update={"sample_scope": scope}) for r in task.requests(inputs)],
        input_sha=consumed_input_sha(store, ds, source),
    )


def _plan_from(store: Warehouse, task: Task, key: str) -> StagePlan:
    return plan_stage(task, store, *partition_parts_of(key))


def oldest_first(keys: Iterable[str]) -> dict[str, int]:
    """Each checked `date|source` key's rank (0 = the oldest day), whatever order the run's
    config lists them in; a request several partitions share goes out at the lowest."""
    return {key: rank for rank, key in enumerate(sorted(keys, key=partition_parts_of))}


def run_partitions(
    context: RunContext,
    stages: Sequence[PipelineStage],
    partitions: Mapping[str, HeldPartition],
    *,
    ledger: Ledger,
    resources: GenerationResources,
    landing: Landing,
    planner: Planner | None = None,
    controls: BatchControls | None = None,
) -> dict[str, PartitionResult]:
    """`stages` over every held partition (key → lease) in one engine run, each partition
    landed stage by stage; every partition's result, in `partitions`' order (see the module
    docstring). `planner` makes a partition's plan of a stage (default `plan_stage`);
    `controls` add a stop time, a cancel poll (a cancel raises `BatchCancelledError`, nothing
    lands) and a hook on the planned keys."""
    names = ", ".join(stage.asset.to_user_string() for stage in stages)
    label = f"{names} " + (
        next(iter(partitions)) if len(partitions) == 1 else f"({len(partitions)} partitions)"
    )
    store = resources.warehouse.warehouse()
    # One landing thread: Parquet, checks and records off the event loop, one partition at a time.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="landing") as lands:
        try:
            driver = _Driver(
                context,
                resources,
                store,
                landing,
                lands,
                oldest_first(partitions),
                planner or partial(_plan_from, store),
                controls or BatchControls(),
            )
            work = driver.run(stages, partitions, ledger, label)
            cancelled = driver.controls.cancelled
            results = run_interruptibly(
                work if cancelled is None else unless_cancelled(work, cancelled)
            )
        finally:
            lands.shutdown(cancel_futures=True)  # an interrupted run starts no more landings
    return {key: results[key] for key in partitions}


@dataclass(frozen=True)
class _Driver:
    """One `run_partitions` call: what its partitions' pipelines share."""

    context: RunContext
    resources: GenerationResources
    store: Warehouse
    landing: Landing
    lands: ThreadPoolExecutor
    ranks: Mapping[str, int]
    planner: Planner
    controls: BatchControls

    async def run(
        self,
        stages: Sequence[PipelineStage],
        partitions: Mapping[str, HeldPartition],
        ledger: Ledger,
        label: str,
    ) -> dict[str, PartitionResult]:
        first = {key: self._plan(stages[0].task, key) for key in partitions}
        if not any(isinstance(plan, StagePlan) for plan in first.values()):
            return {key: self._result(key, first[key]) for key in partitions}  # nothing to send
        llama, digest = self.resources.llama, self.resources.digest
        expires_at = self.controls.expires_at
        async with engine_session(
            self.context, llama, digest, ledger, label=label, expires_at=expires_at
        ) as run:
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
            return self.planner(task, key)
        except SKIPPED as error:
            return error

    @staticmethod
    def _result(key: str, plan: StagePlan | BaseException) -> PartitionResult:
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
    ) -> PartitionResult:
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
        self, run: BatchRun, asset: dg.AssetKey, key: str, held: HeldPartition, plan: StagePlan
    ) -> PartitionResult:
        """One partition's stage: its requests at its rank, what it asks again, its landing."""
        outcome = await self._add(run, key, plan.requests, planned=self.controls.on_planned)
        self._log(asset, key, outcome)
        if self._stopped(outcome):
            return PartitionResult(key, stopped=outcome)
        results: Iterable[GenerationResult] | None = None
        if plan.task.asks_again:
            again = await self._off_loop(partial(asked_again, held.ledger, plan, outcome))
            self.context.log.info(
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
        return outcome.stopped_at_window and not self.controls.expired()

    def _log(self, asset: dg.AssetKey, key: str, outcome: BatchOutcome) -> None:
        stats = outcome.stats
        self.context.log.info(
            f"{asset.to_user_string()} {key}: {stats.generated} generated, {stats.from_ledger} "
            f"from the ledger, {stats.failed} failed, {stats.not_started} not started, "
            f"{stats.in_flight_at_start} in flight when it joined, max {stats.max_in_flight}"
        )

    def _land(
        self,
        asset: dg.AssetKey,
        key: str,
        plan: StagePlan,
        held: HeldPartition,
        outcome: BatchOutcome,
        results: Iterable[GenerationResult] | None,
    ) -> PartitionResult:
        """The partition's rows of the stage written, then handed to the landing (on the
        landing thread: it reads the results through the partition's own ledger)."""
        rows = results if results is not None else outcome.iter_results(held.ledger)
        trino = self.resources.trino
        try:
            written = land_stage(
                self.context,
                plan,
                held,
                outcome,
                rows,
                store=self.store,
                trino=trino,
                gate=self.resources.warehouse.quality_gate(),
            )
            tables = [plan.task.table, "quarantine"]
            landed = self.landing.landed(asset, key, tables, held, written)
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
