"""The partition-batch driver as Dagster runs it: `kimi_batch.pipeline.drive` over an asset
step's partition or the nightly op's, with the step's log, the deployment's engine session, the
partition's landing (`land_stage`) and its record (a `Landing`), interruptible by Dagster."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from functools import partial
from typing import Any

import dagster as dg

from kimi_batch.defs.assets.context import RunContext
from kimi_batch.defs.assets.engine_session import engine_session
from kimi_batch.defs.assets.landing import Landing, land_stage
from kimi_batch.defs.interrupts import run_interruptibly
from kimi_batch.defs.resources.digest import DigestResource
from kimi_batch.defs.resources.llama import LlamaServerResource
from kimi_batch.defs.resources.trino import TrinoResource
from kimi_batch.defs.resources.warehouse import WarehouseResource
from kimi_batch.engine import BatchOutcome, BatchRun, GenerationResult, Ledger
from kimi_batch.pipeline import (
    BatchControls,
    GenerationTask,
    HeldPartition,
    PartitionResult,
    PipelineStage,
    StagePlan,
    drive_on,
    partition_parts_of,
    plan_stage,
)
from kimi_batch.settings import Settings
from kimi_batch.warehouse import Warehouse

Task = GenerationTask[Any, Any]
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


def _plan_from(store: Warehouse, task: Task, key: str) -> StagePlan:
    return plan_stage(task, store, *partition_parts_of(key))


@dataclass(frozen=True)
class _StepRun:
    """What the driver asks of a Dagster step (`kimi_batch.pipeline.DriverRun`)."""

    context: RunContext
    resources: GenerationResources
    store: Warehouse
    landing: Landing
    ledger: Ledger
    planner: Planner
    controls: BatchControls

    def log(self, message: str) -> None:
        self.context.log.info(message)

    def plan(self, task: Task, key: str) -> StagePlan:
        return self.planner(task, key)

    def session(self, label: str) -> AbstractAsyncContextManager[BatchRun]:
        llama, digest = self.resources.llama, self.resources.digest
        expires_at = self.controls.expires_at
        return engine_session(
            self.context, llama, digest, self.ledger, label=label, expires_at=expires_at
        )

    def land(
        self,
        asset: str,
        key: str,
        plan: StagePlan,
        held: HeldPartition,
        outcome: BatchOutcome,
        results: Iterable[GenerationResult],
    ) -> dg.MaterializeResult:
        """The partition's rows of the stage written, then handed to the landing."""
        written = land_stage(
            self.context,
            plan,
            held,
            outcome,
            results,
            store=self.store,
            trino=self.resources.trino,
            gate=self.resources.warehouse.quality_gate(),
        )
        tables = [plan.task.table, "quarantine"]
        return self.landing.landed(dg.AssetKey(asset), key, tables, held, written)


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
) -> dict[str, PartitionResult[dg.MaterializeResult]]:
    """`stages` over every held partition (key -> lease) in one engine run, each partition
    landed stage by stage (`kimi_batch.pipeline.drive`); every partition's result, in
    `partitions`' order. `planner` makes a partition's plan of a stage (default `plan_stage`);
    `controls` add a stop time, a cancel poll (a cancel raises `BatchCancelledError`, nothing
    lands) and a hook on the planned keys."""
    store = resources.warehouse.warehouse()
    controls = controls or BatchControls()
    planner = planner or partial(_plan_from, store)
    run = _StepRun(context, resources, store, landing, ledger, planner, controls)
    return drive_on(run_interruptibly, run, stages, partitions, controls)
