"""Partitioned batch assets: seeds landed from the inbox, amplified variants, teacher answers.

Their partitions depend on the deployment (`kimi_batch.defs.partitions`), so the assets are made
by `build_batch_assets(partitions)`; `defs` builds them for the code location from the one
`Settings` (`kimi_batch.defs.deployment`).
"""

from datetime import UTC, datetime

import dagster as dg
from pydantic import Field

from kimi_batch.defs.assets.stage_asset import (
    ASSET_OWNERS,
    LLAMA_POOL,
    RunContext,
    generation_asset,
    interruptible_runner,
    partition_parts,
    step_lease,
    table_metadata,
)
from kimi_batch.defs.deployment import deployment_settings
from kimi_batch.defs.jobs import BATCH_GROUP, INGEST_TAG, NIGHT_END_TAG, OPTIONAL_TAG
from kimi_batch.defs.partitions import build_batch_partitions
from kimi_batch.defs.resources import (
    DigestResource,
    LlamaServerResource,
    TrinoResource,
    WarehouseResource,
)
from kimi_batch.inputs import ResolvedInput
from kimi_batch.pipeline import (
    SEED_ASSET,
    STAGE_DECLARATIONS,
    HeldPartition,
    StageDeclaration,
    night_end,
    resolve_seeds_input,
    seed_figures,
    seeds_consumed,
    stage_check_names,
    write_seeds,
)
from kimi_batch.settings import Settings


class SeedConfig(dg.Config):
    answer_budget_tokens: int = Field(
        default=256, gt=0, description="Context kept free for the answer when checking length."
    )


def seeds_are_current(warehouse: WarehouseResource, resolved: ResolvedInput) -> bool:
    """`pipeline.seeds_consumed` in the deployment's manifest and warehouse."""
    with warehouse.landing() as landing:
        return seeds_consumed(landing, warehouse.warehouse(), resolved)


def seed_prompts(
    context: dg.AssetExecutionContext,
    config: SeedConfig,
    llama: LlamaServerResource,
    digest: DigestResource,
    warehouse: WarehouseResource,
    trino: TrinoResource,
) -> dg.MaterializeResult:
    """Validated input rows of one landed inbox file (table `seeds`); bad rows go to quarantine."""
    ds, source = partition_parts(context)
    with step_lease(context, warehouse, ds, source) as held:
        return land_seed_partition(
            context,
            config,
            held,
            resolve_seeds_input(llama.settings(), ds, source),
            llama=llama,
            digest=digest,
            warehouse=warehouse,
            trino=trino,
        )


def land_seed_partition(
    context: RunContext,
    config: SeedConfig,
    held: HeldPartition,
    resolved: ResolvedInput,
    *,
    llama: LlamaServerResource,
    digest: DigestResource,
    warehouse: WarehouseResource,
    trino: TrinoResource,
) -> dg.MaterializeResult:
    """Land the partition's `resolved` input as its `seeds` rows (the run holds the partition's
    lease); Trino sees the commit on its next query."""
    if resolved.deferred:
        context.log.warning(f"{resolved.deferred}; this run reads the last landed version")
    store = warehouse.warehouse()
    with interruptible_runner() as runner, warehouse.landing() as landing:
        seeds = write_seeds(
            runner,
            (store, landing),
            resolved,
            server=llama.server(),
            digest=digest.load(),
            answer_budget_tokens=config.answer_budget_tokens,
            held=held,
            now=datetime.now(UTC),
        )
    written, sha = seeds.written, resolved.version.sha256 if resolved.version else None
    metadata: dict[str, dg.RawMetadataValue] = {
        **seed_figures(seeds, resolved),
        **table_metadata(
            "seeds",
            table_name=trino.table_name("seeds"),
            uri=written.location,
            table_rows=store.count("seeds"),
            partition_rows=written.rows,
            snapshot_id=written.snapshot_id,
        ),
    }
    return dg.MaterializeResult(
        # The landed version is the data version: downstream partitions built from another one
        # are shown stale (Dagster's provenance), and `status`/the nightly read the full sha.
        data_version=dg.DataVersion(sha) if sha else None,
        metadata=metadata,
    )


def build_batch_assets(
    partitions: dg.PartitionsDefinition, settings: Settings | None = None
) -> list[dg.AssetsDefinition]:
    """seed_prompts, then one asset per declared stage (`STAGE_DECLARATIONS`), over
    `partitions`; with `settings`, only the stages they switch on (what a run of "everything"
    materializes: the demo, the bench), without, all of them (the code location)."""
    seeds = dg.asset(
        name=SEED_ASSET,
        partitions_def=partitions,
        group_name=BATCH_GROUP,
        # `llama.server().prepare()` may start the server and asks it to tokenize: a llama step too.
        pool=LLAMA_POOL,
        kinds={"parquet", "trino"},
        owners=ASSET_OWNERS,
        # The ingest job lands the seeds first (defs/jobs.py selects by this tag).
        tags={INGEST_TAG: "true"},
    )(seed_prompts)
    declared = [d for d in STAGE_DECLARATIONS.values() if settings is None or d.enabled(settings)]
    end = night_end()
    return [seeds, *(declared_asset(d, partitions, night_end=d is end) for d in declared)]


def declared_asset(
    declaration: StageDeclaration, partitions: dg.PartitionsDefinition, *, night_end: bool = False
) -> dg.AssetsDefinition:
    """The asset of one declared stage over `partitions` (`night_end`: the night's last stage,
    the end of `distillation_job`)."""
    return generation_asset(
        declaration,
        partitions=partitions,
        tags={
            **({INGEST_TAG: "true"} if declaration.ingest else {}),
            **({OPTIONAL_TAG: "true"} if declaration.switch else {}),
            **({NIGHT_END_TAG: "true"} if night_end else {}),
        },
        checks=stage_check_names(declaration.task),
    )


@dg.definitions
def defs() -> dg.Definitions:
    """The batch assets over the deployment's (date, source) partitions."""
    return dg.Definitions(assets=build_batch_assets(build_batch_partitions(deployment_settings())))
