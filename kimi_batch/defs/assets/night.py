"""The nightly run: every partition the schedule asks for in one run, through every stage.

A run per partition left the server idle while each run's process started (about 7 s a run on
2 cores, `bench --workload night`). `nightly_job` is one op: it holds each partition's lease,
lands each partition's seeds (unless the day's ingest run landed them from the newest input
version already: they are kept), then runs the partition-batch driver
(`defs/assets/driver.py`) once over every partition still going on and every nightly stage, on
one engine run: the amplification requests of every partition go in first, and a partition's
distillation requests join as soon as its own variants are written, while the newer
partitions still amplify, so the slots stay full across partitions and stages, and a window
that closes during the amplification still leaves the oldest partitions distilled. Each
partition is still written on its own (its Parquet replaced, its quarantine, its checks, its
Iceberg commit, which Trino reads at once) and recorded as its own materialization of
`seed_prompts`, `amplified_prompts` and `distilled_responses` with its own check evaluations as
soon as it lands (`landing.NightLanding`), so the UI, `status` and the next night see it as
after a run of `distillation_job`. An op's materializations carry no data version: once the run
ends, each partition it materialized gets its own asset run that rebuilds it from the ledger
with one (`defs/night_versions.py`).

A partition that cannot go on (its input unreadable, its lease held by another run, a write
refused) is left out and named; past the nightly window the partitions whose rows are not all
done are left for the next night (their finished rows are in the ledger). Either way it goes
no further that night, and the run fails at the end with the list, after every finished
partition is written.
"""

# No `from __future__ import annotations`: Dagster reads the op function's annotations.

from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import dagster as dg
from pydantic import BaseModel, Field, create_model

from kimi_batch.defs.assets.batch import (
    SeedConfig,
    land_seed_partition,
    resolve_seeds_input,
    seeds_are_current,
)
from kimi_batch.defs.assets.context import LLAMA_POOL, failing_step
from kimi_batch.defs.assets.driver import GenerationResources, run_partitions
from kimi_batch.defs.assets.landing import NightLanding
from kimi_batch.defs.assets.night_tag import tag_the_night
from kimi_batch.defs.assets.stage_asset import dagster_config
from kimi_batch.defs.assets.window import mark_stopped_at_window, window_end
from kimi_batch.defs.jobs import (
    JOB_TAG,
    LLAMA_TAG,
    NIGHTLY_JOB_NAME,
    NIGHTLY_OP_NAME,
    SEED_PROMPTS,
)
from kimi_batch.defs.resources.digest import DigestResource
from kimi_batch.defs.resources.llama import LlamaServerResource
from kimi_batch.defs.resources.trino import TrinoResource
from kimi_batch.defs.resources.warehouse import WarehouseResource
from kimi_batch.pipeline import (
    SEED_TABLES,
    SKIPPED,
    HeldPartition,
    PartitionResult,
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


@dataclass
class _Night:
    """The partitions still going on, and why the others stopped."""

    going: dict[str, HeldPartition] = field(default_factory=dict)  # partitions still going on
    failed: dict[str, str] = field(default_factory=dict)
    stopped: list[str] = field(default_factory=list)

    def drop(self, key: str, reason: str) -> None:
        self.going.pop(key, None)
        if key in self.stopped:  # failed after all: named once, as failed
            self.stopped.remove(key)
        self.failed[key] = reason

    def take(self, results: Mapping[str, PartitionResult[dg.MaterializeResult]]) -> None:
        """The driver's results: the failed and the stopped partitions are named."""
        for key, result in results.items():
            if result.failed is not None:
                self.drop(key, _reason(result.failed))
            elif result.stopped is not None:
                self.going.pop(key, None)
                self.stopped.append(key)

    def summary(self, total: int) -> str:
        lines = [f"{total - len(self.failed) - len(self.stopped)} of {total} partitions done"]
        if self.stopped:
            lines.append(
                f"the nightly window ended: {len(self.stopped)} partition(s) resume next night "
                f"({', '.join(self.stopped[:10])})"
            )
        lines += [f"{key}: {reason}" for key, reason in list(self.failed.items())[:20]]
        return "; ".join(lines)


def _reason(error: BaseException) -> str:
    return error.description if isinstance(error, dg.Failure) and error.description else str(error)


def _land_seeds(
    context: dg.OpExecutionContext,
    config: NightConfig,
    night: _Night,
    resources: GenerationResources,
    landing: NightLanding,
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
            landing.landed(SEED_PROMPTS, key, SEED_TABLES, held, result)
        except SKIPPED as error:
            night.drop(key, _reason(error))


def _hold(
    context: dg.OpExecutionContext,
    stack: ExitStack,
    night: _Night,
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
    night = _Night()
    with failing_step():  # a stage's config refused (StageConfigError): the night's failure
        stages = [
            PipelineStage(d.asset, d.build(getattr(config, d.config_field, None), settings))
            for d in nightly_stages(settings)
            if d.asset not in config.skip_stages
        ]
    with ExitStack() as stack:
        _hold(context, stack, night, config.partitions, warehouse)
        landing = NightLanding(context)
        _land_seeds(context, config, night, resources, landing)
        ledger = stack.enter_context(warehouse.ledger())
        if night.going and stages:
            night.take(
                run_partitions(
                    context,
                    stages,
                    dict(night.going),
                    ledger=ledger,
                    resources=resources,
                    landing=landing,
                )
            )
    # What the night published, every table at once: `night-YYYY-MM-DD` on its snapshots.
    tag_the_night(context, warehouse.warehouse(), config.partitions)
    if night.stopped:
        mark_stopped_at_window(context)
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
