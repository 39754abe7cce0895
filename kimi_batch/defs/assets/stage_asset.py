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
from pydantic import BaseModel, Field, create_model

from kimi_batch.defs.assets.driver import (
    LLAMA_POOL,
    GenerationResources,
    failing_step,
    run_partitions,
    step_lease,
    stopped_at_window,
)
from kimi_batch.defs.assets.landing import ASSET_OWNERS, CHECK_NAMES, check_specs
from kimi_batch.defs.jobs import BATCH_GROUP, NIGHT_RUN_TAG
from kimi_batch.defs.partitions import partition_parts
from kimi_batch.defs.resources import (
    DigestResource,
    LlamaServerResource,
    TrinoResource,
    WarehouseResource,
)
from kimi_batch.pipeline import BatchControls, GenerationTask, PipelineStage, StageDeclaration

Task = GenerationTask[Any, Any]


def dagster_config(model: type[BaseModel]) -> Any:
    """Dagster's run-config schema of a pydantic config class (the launchpad shows its fields and
    defaults): the class itself, read as a `dg.Config` (no function's annotations rewritten); the
    step validates its `op_config` with the class."""
    return _as_dagster(model).to_config_schema()


def _as_dagster(model: type[BaseModel]) -> type[dg.Config]:
    """`model` as a `dg.Config` subclass, and so each field that is a pydantic model (Dagster
    reads nested `dg.Config` classes only)."""
    if issubclass(model, dg.Config):
        return model
    nested: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        kind = field.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            inner = _as_dagster(kind)
            nested[name] = (inner, Field(default_factory=inner, description=field.description))
    derived: type[dg.Config] = create_model(  # pyright: ignore[reportAssignmentType]
        model.__name__, __base__=(model, dg.Config), __doc__=model.__doc__, **nested
    )
    return derived


def generation_asset(
    declaration: StageDeclaration,
    *,
    partitions: dg.PartitionsDefinition,
    tags: Mapping[str, str] | None = None,
    checks: Sequence[str] = CHECK_NAMES,
) -> dg.AssetsDefinition:
    """The asset of a declared stage over `partitions` (the deployment's batch partitions,
    `kimi_batch.defs.partitions.build_batch_partitions`), in the llama pool, with the checks
    `checks` (`stage_check_names` of its task class); its run config is the declaration's
    config class (none: the task's defaults)."""
    config_type = declaration.config

    def materialize(
        context: dg.AssetExecutionContext,
        llama: LlamaServerResource,
        digest: DigestResource,
        warehouse: WarehouseResource,
        trino: TrinoResource,
    ) -> dg.MaterializeResult:
        raw = context.op_execution_context.op_config
        config = config_type.model_validate(raw) if config_type else None
        with failing_step():
            stage = declaration.build(config, llama.settings())
        return run_stage(
            context, stage, llama=llama, digest=digest, warehouse=warehouse, trino=trino
        )

    return dg.asset(
        name=declaration.asset,
        description=declaration.description,
        partitions_def=partitions,
        group_name=BATCH_GROUP,
        pool=LLAMA_POOL,
        kinds={"parquet", "trino"},
        owners=ASSET_OWNERS,
        check_specs=check_specs(declaration.asset, partitions, checks),
        deps=list(declaration.reads),
        tags=dict(tags or {}),
        config_schema=dagster_config(config_type) if config_type else None,
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
    with step_lease(context, warehouse, ds, source) as held:
        (result,) = run_partitions(
            context,
            [PipelineStage(context.asset_key.to_user_string(), task)],
            {f"{ds}|{source}": held},
            ledger=held.ledger,
            resources=resources,
            # A version run records what the night landed: never "stopped at the window".
            controls=BatchControls(land_at_window=NIGHT_RUN_TAG in context.run.tags),
        ).values()
        if result.failed is not None:
            with failing_step():
                raise result.failed
    if result.stopped is not None:
        raise stopped_at_window(context, result.stopped)
    assert result.materialized is not None
    return result.materialized
