"""The nightly run (`nightly_job`): every partition the schedule asks for in one run, through
every nightly stage, each partition recorded as it lands (`stage_asset.record`); see "Data
flow" in docs/architecture.md. A partition that cannot go on, or that the window stopped, is
left out and named (`pipeline.NightPartitions`), and the run fails at the end with the list,
after every finished partition is written.
"""

# No `from __future__ import annotations`: Dagster reads the op function's annotations.

import json
from contextlib import ExitStack
from functools import partial
from typing import Any

import dagster as dg
from pydantic import BaseModel, Field, create_model

from kimi_batch.defs.assets.batch import (
    SeedConfig,
    land_seed_partition,
    resolve_seeds_input,
    seeds_are_current,
)
from kimi_batch.defs.assets.night_tag import tag_the_night
from kimi_batch.defs.assets.stage_asset import (
    LLAMA_POOL,
    GenerationResources,
    dagster_config,
    failing_step,
    mark_stopped_at_window,
    record,
    run_partitions,
    window_end,
)
from kimi_batch.defs.jobs import (
    FAILED_PARTITIONS_TAG,
    JOB_TAG,
    LLAMA_TAG,
    NIGHTLY_JOB_NAME,
    NIGHTLY_OP_NAME,
    SEED_PROMPTS,
)
from kimi_batch.defs.resources import (
    DigestResource,
    LlamaServerResource,
    TrinoResource,
    WarehouseResource,
)
from kimi_batch.pipeline import (
    SKIPPED,
    NightPartitions,
    PartitionSkippedError,
    PipelineStage,
    nightly_stages,
    partition_lease,
    partition_parts_of,
    split_partition_key,
)


class NightConfig(BaseModel):
    """The night's partitions (the schedule fills them in) and the seeds' config;
    `night_config_type()` adds a field per nightly stage with a run config (`night_field`)."""

    partitions: list[str] = Field(description="'date|source' partition keys, oldest first.")
    skip_stages: list[str] = Field(
        default_factory=list,
        description="Nightly stages (asset names) not run this night: the stages after them "
        "read the rows they landed already.",
    )
    seeds: SeedConfig = Field(default_factory=SeedConfig)


def night_config_type() -> type[NightConfig]:
    """`NightConfig` with each declared nightly stage's run config as a field, as declared now."""
    fields: dict[str, Any] = {
        d.config_field: (d.config, Field(default_factory=d.config))
        for d in nightly_stages()
        if d.config is not None
    }
    return create_model("NightConfig", __base__=NightConfig, __doc__=NightConfig.__doc__, **fields)


def _reason(error: BaseException) -> str:
    return error.description if isinstance(error, dg.Failure) and error.description else str(error)


def _land_seeds(
    context: dg.OpExecutionContext,
    config: NightConfig,
    night: NightPartitions,
    resources: GenerationResources,
) -> None:
    """Each partition's seeds landed from its newest input version, or kept when they are
    that version."""
    settings = resources.settings
    for key, held in list(night.going.items()):
        try:
            resolved = resolve_seeds_input(settings, *partition_parts_of(key))
            if seeds_are_current(resources.warehouse, resolved):
                continue
            result = land_seed_partition(
                context,
                config.seeds,
                held,
                resolved,
                llama=resources.llama,
                digest=resources.digest,
                warehouse=resources.warehouse,
                trino=resources.trino,
            )
            record(context, SEED_PROMPTS, key, result)
        except SKIPPED as error:
            night.drop(key, _reason(error))


def _hold(
    context: dg.OpExecutionContext,
    stack: ExitStack,
    night: NightPartitions,
    keys: list[str],
    warehouse: WarehouseResource,
) -> None:
    """Each partition's lease, held until the run ends; a key or lease refused is named."""
    for key in keys:
        parts = split_partition_key(key)
        if parts is None:
            night.failed[key] = "not a date|source partition key"
            continue
        try:
            held = partition_lease(warehouse.ledger, *parts, context.run.run_id)
            night.going[key] = stack.enter_context(held)
        except PartitionSkippedError as error:
            night.failed[key] = _reason(error)


def night_batch(
    context: dg.OpExecutionContext,
    llama: LlamaServerResource,
    digest: DigestResource,
    warehouse: WarehouseResource,
    trino: TrinoResource,
) -> None:
    """Seeds, then amplification and distillation of every partition of the night in one
    engine run, each partition's next stage as soon as its last one landed; each partition
    written, materialized and checked on its own."""
    config = night_config_type().model_validate(context.op_config)
    resources = GenerationResources(llama=llama, digest=digest, warehouse=warehouse, trino=trino)
    settings = llama.settings()
    night = NightPartitions()
    with failing_step():  # a stage's config refused (StageConfigError): the night's failure
        stages = [
            PipelineStage(d.asset, d.build(getattr(config, d.config_field, None), settings))
            for d in nightly_stages(settings)
            if d.asset not in config.skip_stages
        ]
    with ExitStack() as stack:
        _hold(context, stack, night, config.partitions, warehouse)
        _land_seeds(context, config, night, resources)
        ledger = stack.enter_context(warehouse.ledger())
        if night.going and stages:
            results = run_partitions(
                context,
                stages,
                dict(night.going),
                ledger=ledger,
                resources=resources,
                on_landed=partial(record, context),
            )
            night.take(results, _reason)
    # What the night published, every table at once: `night-YYYY-MM-DD` on its snapshots.
    tag_the_night(context, warehouse.warehouse(), config.partitions)
    if night.stopped:
        mark_stopped_at_window(context)
        if night.failed:
            failed = json.dumps(sorted(night.failed))
            context.instance.add_run_tags(context.run.run_id, {FAILED_PARTITIONS_TAG: failed})
    if night.failed or night.stopped:
        raise dg.Failure(
            night.summary(len(config.partitions)),
            metadata={
                "partitions": len(config.partitions),
                "failed": len(night.failed),
                "stopped_at_window": len(night.stopped),
                "window_ends": str(window_end(context)),
            },
        )


def build_nightly_job() -> dg.JobDefinition:
    """The nightly job over the stages declared now (`kimi_batch.pipeline.stages`)."""

    # Its run config: a field per nightly stage declared now, read by Dagster from the classes.
    schema = dagster_config(night_config_type())
    night_op = dg.op(name=NIGHTLY_OP_NAME, pool=LLAMA_POOL, config_schema=schema)(night_batch)

    @dg.job(
        name=NIGHTLY_JOB_NAME,
        description="The nightly distillation: every partition the schedule asks for in one run.",
        tags={JOB_TAG: "nightly", LLAMA_TAG: "true"},
        executor_def=dg.in_process_executor,
    )
    def nightly_job() -> None:
        night_op()

    return nightly_job


nightly_job = build_nightly_job()


@dg.definitions
def defs() -> dg.Definitions:
    """The nightly job of this code location, over the stages declared when it loads."""
    return dg.Definitions(jobs=[build_nightly_job()])
