"""The partition-batch driver as Dagster runs it: `kimi_batch.pipeline.drive` over an asset
step's partition or the nightly op's, with the step's log, the deployment's engine session under
the nightly window, the partition's lease (a partition the pipeline skips fails the step), its
landing (`land_stage`) and, for the night's partitions, its record as it lands (`on_landed`), on an event loop a terminated run stops for
certain (`pipeline/server.py`, raising Dagster's own interrupt once the loop has stopped)."""

from __future__ import annotations

from collections.abc import (
    AsyncIterator,
    Callable,
    Coroutine,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any, TypeVar

import dagster as dg

from kimi_batch.defs.assets.landing import RunContext, land_stage
from kimi_batch.defs.jobs import STOPPED_TAG, WINDOW_TAG
from kimi_batch.defs.resources import (
    DigestResource,
    LlamaServerResource,
    TrinoResource,
    WarehouseResource,
)
from kimi_batch.engine import (
    BatchOutcome,
    BatchRun,
    GenerationResult,
    Ledger,
    ProgressEvent,
    notify,
)
from kimi_batch.pipeline import (
    BatchControls,
    GenerationTask,
    HeldPartition,
    InterruptibleRunner,
    PartitionResult,
    PartitionSkippedError,
    PipelineStage,
    StageConfigError,
    StagePlan,
    drive_on,
    generation_figures,
    partition_lease,
    partition_parts_of,
    plan_stage,
)
from kimi_batch.pipeline import interruptible_runner as pipeline_runner
from kimi_batch.settings import Settings
from kimi_batch.warehouse import Warehouse

T = TypeVar("T")

# The Dagster pool of every step that sends requests to the server (dagster.yaml: limit 1).
LLAMA_POOL = "llama_server"


@contextmanager
def failing_step() -> Iterator[None]:
    """A partition the pipeline skips (`PartitionSkippedError`), or a stage's config it refuses
    (`StageConfigError`), fails the step as Dagster's `Failure`: its message, shown without a
    traceback."""
    try:
        yield
    except (PartitionSkippedError, StageConfigError) as error:
        raise dg.Failure(str(error)) from error


@contextmanager
def step_lease(
    context: RunContext, warehouse: WarehouseResource, ds: str, source: str
) -> Iterator[HeldPartition]:
    """The partition's lease for this run; one it cannot hold, or loses, fails the step."""
    with failing_step(), partition_lease(warehouse.ledger, ds, source, context.run.run_id) as held:
        yield held


# ---- the event loop a terminated run stops ------------------------------------------------------


@contextmanager
def interruptible_runner() -> Iterator[InterruptibleRunner]:
    """`asyncio.Runner()` for a Dagster step; closed on exit."""
    with pipeline_runner(dg.DagsterExecutionInterruptedError) as runner:
        yield runner


def run_interruptibly(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run` for a Dagster step: a terminated run cancels `main`."""
    with interruptible_runner() as runner:
        return runner.run(main)


# ---- the nightly window -------------------------------------------------------------------------


def window_end(context: RunContext) -> datetime | None:
    """The run's nightly window end (its WINDOW_TAG), None without one."""
    raw = context.run.tags.get(WINDOW_TAG)
    if not raw:
        return None
    end = datetime.fromisoformat(raw)
    return end if end.tzinfo else end.replace(tzinfo=UTC)


def stopped_at_window(context: dg.AssetExecutionContext, outcome: BatchOutcome) -> dg.Failure:
    """The failure of an asset's partition that the nightly window cut short (the run marked
    so): it fails visibly with what is done, the next night's catch-up continues from the
    ledger."""
    stats = outcome.stats
    done = stats.generated + stats.from_ledger
    mark_stopped_at_window(context)
    return dg.Failure(
        f"the nightly window ended at {window_end(context)}: {done} of {stats.total} rows "
        "done, resumes next night",
        metadata={"rows_done": done, "rows_total": stats.total, **generation_figures(outcome)},
    )


# Dagster's run tag: whether run retries re-execute a run that failed in a step.
RETRY_ON_STEP_FAILURE_TAG = "dagster/retry_on_asset_or_op_failure"


def mark_stopped_at_window(context: RunContext) -> None:
    """Tag the run STOPPED_TAG=true (`status` and the morning alerts name it so) and not to be
    retried: past the window a retry would send nothing, the next night resumes the work."""
    context.instance.add_run_tags(
        context.run.run_id, {STOPPED_TAG: "true", RETRY_ON_STEP_FAILURE_TAG: "false"}
    )


# ---- the engine session -------------------------------------------------------------------------


def _progress_reporter(context: RunContext, label: str) -> Callable[[ProgressEvent], None]:
    """The run log gets the periodic line; in-process listeners (a terminal bar) the event."""

    def report(event: ProgressEvent) -> None:
        context.log.info(str(event))
        notify(event.model_copy(update={"label": label}))

    return report


@asynccontextmanager
async def engine_session(
    context: RunContext,
    llama: LlamaServerResource,
    digest: DigestResource,
    ledger: Ledger,
    *,
    label: str,
    expires_at: datetime | None = None,
) -> AsyncIterator[BatchRun]:
    """One engine run under the run's window and the work's own end (`expires_at`, whichever
    comes first), open while the block adds requests to it (a batch's outcome says whether
    either cut it short); progress is logged as `label`."""
    ends = [end for end in (window_end(context), expires_at) if end is not None]
    reporter = _progress_reporter(context, label)
    session = llama.server().session(
        digest.load(), ledger, on_progress=reporter, stop_at=min(ends, default=None)
    )
    async with session as run:
        yield run


# ---- the driver ---------------------------------------------------------------------------------


Task = GenerationTask[Any, Any]
# A partition's plan of a stage (default `plan_stage`: its inputs read from the warehouse).
Planner = Callable[[Task, str], StagePlan]
# What is done with a partition's result as it lands (the night op logs it: `landing.record`).
OnLanded = Callable[[dg.AssetKey, str, dg.MaterializeResult], None]


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
    on_landed: OnLanded | None
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
        """The partition's rows of the stage written, then handed to `on_landed`."""
        written = land_stage(
            self.context,
            plan,
            held,
            outcome,
            results,
            store=self.store,
            trino=self.resources.trino,
            # Only a gated stage's rows pass the gate: another opens no duplicate index.
            gate=self.resources.warehouse.quality_gate() if plan.task.quality_gated else None,
        )
        if self.on_landed is not None:
            self.on_landed(dg.AssetKey(asset), key, written)
        return written


def run_partitions(
    context: RunContext,
    stages: Sequence[PipelineStage],
    partitions: Mapping[str, HeldPartition],
    *,
    ledger: Ledger,
    resources: GenerationResources,
    on_landed: OnLanded | None = None,
    planner: Planner | None = None,
    controls: BatchControls | None = None,
) -> dict[str, PartitionResult[dg.MaterializeResult]]:
    """`stages` over every held partition (key -> lease) in one engine run, each partition
    landed stage by stage (`kimi_batch.pipeline.drive`) and handed to `on_landed` (an asset step
    leaves its one result to Dagster); every partition's result, in `partitions`' order. `planner` makes a partition's plan of a stage (default `plan_stage`);
    `controls` add a stop time, a cancel poll (a cancel raises `BatchCancelledError`, nothing
    lands) and a hook on the planned keys."""
    store = resources.warehouse.warehouse()
    controls = controls or BatchControls()
    planner = planner or partial(_plan_from, store)
    run = _StepRun(context, resources, store, on_landed, ledger, planner, controls)
    return drive_on(run_interruptibly, run, stages, partitions, controls)
