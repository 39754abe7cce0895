"""Partitioned batch assets: seeds landed from the inbox, amplified variants, teacher answers.

Their partitions depend on the deployment (`kimi_batch.defs.partitions`), so the assets are made
by `build_batch_assets(partitions)`; `defs` builds them for the code location from the one
`Settings` (`kimi_batch.defs.deployment`).
"""

from datetime import UTC, datetime

import dagster as dg
from pydantic import Field

from kimi_batch.defs.assets.context import LLAMA_POOL, RunContext, step_lease
from kimi_batch.defs.assets.stage_asset import generation_asset
from kimi_batch.defs.deployment import deployment_settings
from kimi_batch.defs.interrupts import interruptible_runner
from kimi_batch.defs.jobs import BATCH_GROUP, INGEST_TAG, NIGHT_END_TAG, OPTIONAL_TAG
from kimi_batch.defs.metadata import ASSET_OWNERS, table_metadata
from kimi_batch.defs.partitions import build_batch_partitions, partition_parts
from kimi_batch.defs.resources.digest import DigestResource
from kimi_batch.defs.resources.llama import LlamaServerResource
from kimi_batch.defs.resources.trino import TrinoResource
from kimi_batch.defs.resources.warehouse import WarehouseResource
from kimi_batch.inputs import InputReader
from kimi_batch.pipeline import (
    SEED_ASSET,
    STAGE_DECLARATIONS,
    HeldPartition,
    InterruptibleRunner,
    PartitionSkippedError,
    QuarantineRow,
    StageDeclaration,
    check_prompt_lengths,
    consumed_input_sha,
    file_row,
    night_end,
    stage_check_names,
)
from kimi_batch.settings import Settings
from kimi_batch.storage import (
    Landing,
    ResolvedInput,
    StorageError,
    land_input,
    resolve_partition,
)
from kimi_batch.warehouse import PartitionWrite, Warehouse


class SeedConfig(dg.Config):
    answer_budget_tokens: int = Field(
        default=256, gt=0, description="Context kept free for the answer when checking length."
    )


def resolve_seeds_input(settings: Settings, ds: str, source: str) -> ResolvedInput:
    """The partition's input to land (its inbox file landed now, else its newest snapshot)."""
    try:
        return resolve_partition(settings, ds, source)
    except StorageError as error:
        raise PartitionSkippedError(str(error)) from error


def seeds_are_current(warehouse: WarehouseResource, resolved: ResolvedInput) -> bool:
    """The partition's `seeds` and input quarantine were landed from `resolved`'s version
    already (the day's ingest run did it), with nothing about the file to set aside."""
    version, item = resolved.version, resolved.assignment
    if version is None or resolved.problem:
        return False
    with warehouse.landing() as landing:
        # Both writes finished: seeds at this version alone may be a run killed before the
        # quarantine's write (issue 42 item 4), whose rejected lines only a landing writes.
        if landing.consumed(item.ds, item.source) != version.sha256:
            return False
    return consumed_input_sha(warehouse.warehouse(), item.ds, item.source) == version.sha256


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
    name, version, now = resolved.assignment.name, resolved.version, datetime.now(UTC)
    set_aside = (
        [file_row(source_file=name, reason=resolved.problem, created_at=now)]
        if (resolved.problem)
        else []
    )
    store = warehouse.warehouse()
    with interruptible_runner() as runner, warehouse.landing() as landing:
        written, limit = _write_seeds(
            runner,
            (store, landing),
            resolved,
            set_aside,
            llama=llama,
            digest=digest,
            config=config,
            held=held,
            now=now,
        )
        sha = version.sha256 if version else None
    metadata = _seed_metadata(
        written,
        quarantined=len(set_aside),
        resolved=resolved,
        limit=limit,
        store=store,
        trino=trino,
    )
    return dg.MaterializeResult(
        # The landed version is the data version: downstream partitions built from another one
        # are shown stale (Dagster's provenance), and `status`/the nightly read the full sha.
        data_version=dg.DataVersion(sha) if sha else None,
        metadata=metadata,
    )


def _seed_metadata(
    written: PartitionWrite,
    *,
    quarantined: int,
    resolved: ResolvedInput,
    limit: int,
    store: Warehouse,
    trino: TrinoResource,
) -> "dict[str, dg.RawMetadataValue]":
    """What a seeds partition's materialization says: counts, its input, Dagster's table keys."""
    sha = resolved.version.sha256 if resolved.version else None
    return {
        "rows": written.rows,
        "quarantined": quarantined,
        "source_file": resolved.assignment.name,
        "input_sha256": dg.MetadataValue.text(sha or "none"),
        "read_from": "inbox" if resolved.from_inbox else "landed snapshot",
        "prompt_token_limit": limit,
        **table_metadata(
            "seeds",
            table_name=trino.table_name("seeds"),
            uri=written.location,
            table_rows=store.count("seeds"),
            partition_rows=written.rows,
            snapshot_id=written.snapshot_id,
        ),
    }


def _write_seeds(
    runner: InterruptibleRunner,
    stores: tuple[Warehouse, Landing],
    resolved: ResolvedInput,
    set_aside: list[QuarantineRow],
    *,
    llama: LlamaServerResource,
    digest: DigestResource,
    config: SeedConfig,
    held: HeldPartition,
    now: datetime,
) -> tuple[PartitionWrite, int]:
    """Write the `seeds` partition and the input quarantine (`land_input`), quarantining prompts
    over the server's per-slot limit; returns the write and that limit (in tokens, the answer
    budget left out)."""
    settings, server = llama.settings(), llama.server()
    version = resolved.version
    client = server.client()
    try:
        prepared = runner.run(server.prepare(digest.load()))
        first = prepared.endpoints[0]
        limit = (first.ctx or settings.llama_ctx // first.slots) - config.answer_budget_tokens
        written = land_input(
            *stores,
            resolved.assignment.ds,
            resolved.assignment.source,
            snapshot=version.path if version else None,
            reader=InputReader(
                source_name=resolved.assignment.name,
                now=now,
                max_input_bytes=settings.max_input_bytes,
            ),
            input_sha256=version.sha256 if version else "",
            check_lengths=lambda seeds: runner.run(
                check_prompt_lengths(
                    seeds, client, digest_tokens=prepared.digest_tokens, limit=limit, now=now
                )
            ),
            now=now,
            set_aside=set_aside,
            guard=held.lease,
        )
    finally:
        runner.run(client.aclose())
    return written, limit


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
        # `llama.prepare()` may start the server and asks it to tokenize: a llama step too.
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
