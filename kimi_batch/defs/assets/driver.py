"""The partition-batch driver: one stage over N held partitions, in one engine batch.

`run_partitions` plans each partition's requests of a stage (its inputs read from the warehouse),
sends the requests of all of them as one batch, so the slots stay full across partitions, with
the oldest partition first (a request's priority is its partition's rank), asks again what the
stage wants asked again, then lands each partition (`landing.land_stage`) and hands it to its
`Landing` (published now, or behind the next batch). It returns each partition's result: landed,
stopped at the nightly window (left for the next night, its finished rows in the ledger), or
failed (the error). An asset runs it with its one partition (`stage.run_stage`), the nightly op
with the night's partitions, once per stage.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import dagster as dg

from kimi_batch.defs.assets._generation import (
    BatchCancelledError,
    BatchControls,
    HeldPartition,
    RunContext,
    generate,
    read_rows,
)
from kimi_batch.defs.assets.landing import (
    Landing,
    StagePlan,
    consumed_input_sha,
    land_stage,
    partition_parts_of,
)
from kimi_batch.defs.resources.digest import DigestResource
from kimi_batch.defs.resources.llama import LlamaServerResource
from kimi_batch.defs.resources.trino import TrinoResource
from kimi_batch.defs.resources.warehouse import WarehouseResource
from kimi_batch.engine import (
    BatchOutcome,
    GenerationRequest,
    GenerationResult,
    LeaseLostError,
    Ledger,
)
from kimi_batch.errors import KimiBatchError
from kimi_batch.storage import Warehouse
from kimi_batch.tasks.stage import GenerationTask, RowReader
from kimi_batch.tasks.stages import register_stage

__all__ = [
    "SKIPPED",
    "BatchCancelledError",
    "BatchControls",
    "GenerationResources",
    "PartitionResult",
    "asked_again",
    "oldest_first",
    "plan_stage",
    "run_partitions",
    "sample_scope",
]

Task = GenerationTask[Any, Any]
# What leaves one partition out while the others go on (its input, its lease, a write refused).
SKIPPED = (dg.Failure, LeaseLostError, KimiBatchError)


@dataclass(frozen=True)
class GenerationResources:
    """The resources a stage's run uses, as one bundle."""

    llama: LlamaServerResource
    digest: DigestResource
    warehouse: WarehouseResource
    trino: TrinoResource


@dataclass(frozen=True)
class PartitionResult:
    """What became of one partition: landed (`materialized`, with its share of the batch as
    `outcome`), `stopped` at the nightly window (its share of the batch), or `failed` (why)."""

    key: str
    materialized: dg.MaterializeResult | None = None
    stopped: BatchOutcome | None = None
    failed: BaseException | None = None
    outcome: BatchOutcome | None = None


class _WindowEndedError(Exception):
    """The window closed during a partition's asking again: it resumes next night whole."""

    def __init__(self, outcome: BatchOutcome) -> None:
        super().__init__("the nightly window ended while asking again")
        self.outcome = outcome


def sample_scope(task: Task, ds: str, source: str) -> str:
    """Where a stage's input rows live: a request that samples (not greedy, no fixed seed) is
    this partition's own, apart from the same request asked in another partition or stage."""
    return f"{task.name}|{ds}|{source}"


def plan_stage(task: Task, store: Warehouse, ds: str, source: str) -> StagePlan:
    """Read the partition's inputs of `task` and build its requests (each row its own sample)."""
    register_stage(type(task))
    reader: RowReader = lambda table, model: read_rows(store, table, ds, source, model)  # noqa: E731
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


def oldest_first(keys: Iterable[str]) -> dict[str, int]:
    """Each checked `date|source` key's rank (0 = the oldest day), whatever order the run's
    config lists them in; a request several partitions share goes out at the lowest."""
    return {key: rank for rank, key in enumerate(sorted(keys, key=partition_parts_of))}


def run_partitions(
    context: RunContext,
    asset: dg.AssetKey,
    task: Task,
    partitions: Mapping[str, HeldPartition],
    *,
    ledger: Ledger,
    resources: GenerationResources,
    landing: Landing,
    planner: Callable[[str], StagePlan] | None = None,
    controls: BatchControls | None = None,
) -> dict[str, PartitionResult]:
    """`task` over every held partition (key → lease) in one engine batch, each then landed;
    every partition's result, in `partitions`' order (see the module docstring).

    `planner` makes a partition's plan (default: `plan_stage`, its inputs read from the
    warehouse); `controls` adds a stop time, a cancel poll and a hook on the planned keys to
    the batch (a cancel raises `BatchCancelledError`, nothing landed)."""
    store = resources.warehouse.warehouse()
    plans: dict[str, StagePlan] = {}
    results: dict[str, PartitionResult] = {}
    for key in partitions:
        try:
            plans[key] = (
                planner(key) if planner else plan_stage(task, store, *partition_parts_of(key))
            )
        except SKIPPED as error:
            results[key] = PartitionResult(key, failed=error)
    label = f"{asset.to_user_string()} " + (
        next(iter(plans)) if len(plans) == 1 else f"({len(plans)} partitions)"
    )
    run = _StageRun(
        context, asset, ledger, resources, store, landing, label, controls or BatchControls()
    )
    shares = run.one_batch(plans) if plans else {}
    for key, share in shares.items():
        results[key] = run.land(key, plans[key], partitions[key], share)
    return {key: results[key] for key in partitions}


@dataclass(frozen=True)
class _StageRun:
    """One `run_partitions` call: what its batch and its landings share."""

    context: RunContext
    asset: dg.AssetKey
    ledger: Ledger
    resources: GenerationResources
    store: Warehouse
    landing: Landing
    label: str
    controls: BatchControls

    def generate(
        self, requests: Sequence[GenerationRequest], *, asked_again: bool = False
    ) -> BatchOutcome:
        llama, digest = self.resources.llama, self.resources.digest
        # The planned keys are the partitions' requests; those asked again only replace answers.
        controls = replace(self.controls, on_planned=None) if asked_again else self.controls
        return generate(
            self.context, llama, digest, self.ledger, requests, label=self.label, controls=controls
        )

    def one_batch(self, plans: Mapping[str, StagePlan]) -> dict[str, BatchOutcome]:
        """The plans' requests as one batch, the oldest partition first; each one's share."""
        ranks = oldest_first(plans)
        outcome = self.generate(
            [
                request.model_copy(update={"priority": ranks[key]})
                for key, plan in plans.items()
                for request in plan.requests
            ]
        )
        shares: dict[str, BatchOutcome] = {}
        start = 0
        for key, plan in plans.items():
            shares[key] = outcome.share(slice(start, start + len(plan.requests)), self.ledger)
            start += len(plan.requests)
        return shares

    def rerun(self, again: list[GenerationRequest]) -> BatchOutcome:
        outcome = self.generate(again, asked_again=True)
        if outcome.stopped_at_window:
            raise _WindowEndedError(outcome)
        return outcome

    def land(
        self, key: str, plan: StagePlan, held: HeldPartition, share: BatchOutcome
    ) -> PartitionResult:
        """One partition's share of the batch written, then handed to the landing; one the
        window stopped waits for the next night, one past its own end lands what it has."""
        if share.stopped_at_window and not self.controls.expired():
            return PartitionResult(key, stopped=share)
        results = share.iter_results(self.ledger)
        if plan.task.asks_again:
            results = asked_again(self.context, self.ledger, plan, share, rerun=self.rerun)
        trino = self.resources.trino
        tables = [plan.task.table, "quarantine"]
        try:
            written = land_stage(
                self.context,
                plan,
                held,
                share,
                results,
                store=self.store,
                trino=trino,
                publish_now=False,
            )
            landed = self.landing.landed(self.asset, key, tables, held, written)
        except _WindowEndedError as ended:
            return PartitionResult(key, stopped=ended.outcome)
        except SKIPPED as error:
            return PartitionResult(key, failed=error)
        return PartitionResult(key, materialized=landed, outcome=share)


def asked_again(
    context: RunContext,
    ledger: Ledger,
    plan: StagePlan,
    outcome: BatchOutcome,
    *,
    rerun: Callable[[list[GenerationRequest]], BatchOutcome],
) -> Iterator[GenerationResult]:
    """The batch's results, each one the stage asks again for replaced by its new answer
    (`rerun` runs the new requests)."""
    task, requests = plan.task, plan.requests
    by_id = {row.request_id: req for row, req in zip(outcome.planned, requests, strict=True)}
    again: dict[str, GenerationRequest] = {}
    for result in outcome.iter_results(ledger):
        retry = task.retry(by_id[result.request_id], result)
        if retry is not None:
            again[result.request_id] = retry
    context.log.info(f"asking again for {len(again)} answer(s) of the {task.name} stage")
    retried = rerun(list(again.values())) if again else None
    replacements = {
        (r.input_id, r.tag): r for r in (retried.iter_results(ledger) if retried else ())
    }
    for result in outcome.iter_results(ledger):
        replaced = replacements.get((result.input_id, result.tag))
        yield replaced if replaced is not None and result.request_id in again else result
