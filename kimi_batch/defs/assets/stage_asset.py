"""One asset per generation stage: `generation_asset(...)` turns a `GenerationTask` into a
partitioned, pooled asset; `run_stage` is what every such asset runs.

The run, for any stage, is the partition-batch driver (`defs/assets/driver.py`) over the asset's
one partition, under its lease: read its inputs, build its requests, run them (the ledger skips
what is done), ask again what the stage wants asked again, stream the results from the ledger
through the stage's `StageSink` into the partition's table, write the sink's quarantine rows,
and judge the checks before the step returns its result.
"""

# No `from __future__ import annotations`: Dagster reads the asset function's annotations.

from collections.abc import Mapping, Sequence
from typing import Any

import dagster as dg

from kimi_batch.defs.assets.checks import CHECK_NAMES, check_specs
from kimi_batch.defs.assets.context import LLAMA_POOL, failing_step, step_lease
from kimi_batch.defs.assets.driver import GenerationResources, PipelineStage, run_partitions
from kimi_batch.defs.assets.landing import StepLanding
from kimi_batch.defs.assets.window import stopped_at_window
from kimi_batch.defs.metadata import ASSET_OWNERS
from kimi_batch.defs.partitions import partition_parts
from kimi_batch.defs.resources.digest import DigestResource
from kimi_batch.defs.resources.llama import LlamaServerResource
from kimi_batch.defs.resources.trino import TrinoResource
from kimi_batch.defs.resources.warehouse import WarehouseResource
from kimi_batch.defs.stages import BATCH_GROUP, StageConfig
from kimi_batch.pipeline import GenerationTask, register_stage

__all__ = ["StageConfig", "generation_asset", "run_stage"]

Task = GenerationTask[Any, Any]


class _FixedTask(StageConfig):
    """No run config: the asset runs the task it was made with."""


def generation_asset(
    *,
    name: str,
    task: type[StageConfig] | Task,
    partitions: dg.PartitionsDefinition,
    description: str,
    deps: Sequence[dg.AssetsDefinition | str] = (),
    tags: Mapping[str, str] | None = None,
    checks: Sequence[str] = CHECK_NAMES,
) -> dg.AssetsDefinition:
    """The asset `name` of one stage over `partitions` (the deployment's batch partitions,
    `kimi_batch.defs.partitions.build_batch_partitions`), in the llama pool, with the checks.

    `task` is a `StageConfig` class (run config builds the task) or a task (no run config);
    `checks`: the check names it declares (`stage_check_names` of its task class).
    """
    config_type = task if isinstance(task, type) else _FixedTask
    fixed = None if isinstance(task, type) else task
    if fixed is not None:
        register_stage(type(fixed))

    def materialize(
        context: dg.AssetExecutionContext,
        config: StageConfig,
        llama: LlamaServerResource,
        digest: DigestResource,
        warehouse: WarehouseResource,
        trino: TrinoResource,
    ) -> dg.MaterializeResult:
        stage = fixed or config.task(llama.settings())
        return run_stage(
            context, stage, llama=llama, digest=digest, warehouse=warehouse, trino=trino
        )

    # Dagster takes the run-config schema from the annotation: this stage's own config class.
    materialize.__annotations__["config"] = config_type
    return dg.asset(
        name=name,
        description=description,
        partitions_def=partitions,
        group_name=BATCH_GROUP,
        pool=LLAMA_POOL,
        kinds={"parquet", "trino"},
        owners=ASSET_OWNERS,
        check_specs=check_specs(name, partitions, checks),
        deps=list(deps),
        tags=dict(tags or {}),
    )(materialize)


def run_stage(
    context: dg.AssetExecutionContext,
    task: Task,
    *,
    llama: LlamaServerResource,
    digest: DigestResource,
    warehouse: WarehouseResource,
    trino: TrinoResource,
) -> dg.MaterializeResult:
    """Generate the partition's rows of `task`'s table: the driver over this one partition,
    under its lease, committed before the step returns."""
    ds, source = partition_parts(context)
    resources = GenerationResources(llama=llama, digest=digest, warehouse=warehouse, trino=trino)
    landing = StepLanding()
    with step_lease(context, warehouse, ds, source) as held:
        (result,) = run_partitions(
            context,
            [PipelineStage(context.asset_key, task)],
            {f"{ds}|{source}": held},
            ledger=held.ledger,
            resources=resources,
            landing=landing,
        ).values()
        if result.failed is not None:
            with failing_step():
                raise result.failed
    if result.stopped is not None:
        raise stopped_at_window(context, result.stopped)
    assert result.materialized is not None
    return result.materialized
