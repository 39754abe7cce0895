"""Partitioned batch assets: seeds landed from the inbox, amplified variants, teacher answers."""

import asyncio
import importlib
from collections.abc import Sequence
from datetime import UTC, datetime

import dagster as dg
from pydantic import BaseModel, Field

from kimi_batch.defs.assets._generation import (
    BATCH_GROUP,
    LLAMA_POOL,
    check_specs,
    iter_batch_results,
    land_outputs,
    publish,
    read_rows,
    run_batch,
)
from kimi_batch.defs.partitions import batch_partitions, partition_parts
from kimi_batch.defs.resources.digest import DigestResource
from kimi_batch.defs.resources.llama import LlamaServerResource
from kimi_batch.defs.resources.trino import TrinoResource
from kimi_batch.defs.resources.warehouse import WarehouseResource
from kimi_batch.engine.digest import SystemDigest
from kimi_batch.engine.prepare import Prepared
from kimi_batch.engine.requests import SamplingParams
from kimi_batch.llama.client import LlamaClient
from kimi_batch.storage import StorageError
from kimi_batch.storage.landing import resolve_input
from kimi_batch.storage.quarantine import replace_quarantine
from kimi_batch.tasks.amplify import Strategy, amplification_requests, to_amplified_rows
from kimi_batch.tasks.distill import distillation_requests, to_distilled_rows
from kimi_batch.tasks.inputs import SeedPrompt, quarantine_overlong, read_inbox_file
from kimi_batch.tasks.quarantine import file_row
from kimi_batch.tasks.rows import AmplifiedRow, SeedRow
from kimi_batch.tasks.seeds import seed_rows, seeds_from_rows

__all__ = [
    "AmplifyConfig",
    "DistillConfig",
    "amplified_prompts",
    "distilled_responses",
    "seed_prompts",
]


class SeedConfig(dg.Config):
    answer_budget_tokens: int = Field(
        default=256, gt=0, description="Context kept free for the answer when checking length."
    )


class AmplifyConfig(dg.Config):
    strategies: list[str] = Field(default_factory=lambda: [s.value for s in Strategy])
    variants_per_strategy: int = Field(default=1, ge=1, le=16)
    max_tokens: int = Field(default=128, gt=0)
    temperature: float = Field(default=0.9, ge=0.0, le=2.0)
    seed: int = Field(default=7, description="Base sampling seed: reruns ask the same questions.")


class DistillConfig(dg.Config):
    max_tokens: int = Field(default=256, gt=0, description="Kept within the server's n_predict.")
    temperature: float = Field(default=0.7, ge=0.0, le=2.0)
    seed: int = Field(default=11)
    n_probs: int = Field(default=0, ge=0, le=20, description="Top-k logprobs per token (0: off).")
    output_model: str | None = Field(
        default=None,
        description="'package.module:Model' of a pydantic model: the answer is constrained to its "
        "JSON schema and validated; answers that do not validate go to quarantine.",
    )


def _import_model(path: str, allowed: Sequence[str]) -> type[BaseModel]:
    """The pydantic model `module:Name`, only from the deployment's allowed modules."""
    module_name, _, name = path.partition(":")
    if not any(module_name == m or module_name.startswith(m + ".") for m in allowed):
        raise dg.Failure(
            f"output_model {path!r} is not in an allowed module ({', '.join(allowed)}); "
            "extend KIMI_BATCH_OUTPUT_MODEL_MODULES in the deployment"
        )
    try:
        found = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError) as error:
        raise dg.Failure(f"output_model {path!r} cannot be imported: {error}") from error
    if not (isinstance(found, type) and issubclass(found, BaseModel)):
        raise dg.Failure(f"output_model {path!r} is not a pydantic model")
    return found


async def _token_counts(client: LlamaClient, seeds: Sequence[SeedPrompt]) -> dict[str, int]:
    """Tokens of each seed's user side, in one client session."""
    async with client:
        return {
            s.input_id: len(await client.tokenize("\n".join(m.content for m in s.messages)))
            for s in seeds
        }


@dg.asset(
    partitions_def=batch_partitions,
    group_name=BATCH_GROUP,
    kinds={"parquet", "trino"},
    check_specs=[dg.AssetCheckSpec("published_to_trino", asset="seed_prompts")],
)
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
    settings = llama.settings()
    with warehouse.landing() as landing:
        try:
            resolved = resolve_input(
                landing,
                settings.paths.inbox_dir,
                ds,
                source,
                max_bytes=settings.max_input_bytes,
                arrived=settings.today(),
                start=settings.first_partition_date(),
            )
        except StorageError as error:
            raise dg.Failure(str(error)) from error
    now = datetime.now(UTC)
    quarantined = (
        [file_row(source_file=resolved.assignment.name, reason=resolved.problem, created_at=now)]
        if resolved.problem
        else []
    )
    seeds: list[SeedPrompt] = []
    counts: dict[str, int] = {}
    limit = 0
    if resolved.version is not None:
        batch = read_inbox_file(resolved.version.path, source_name=resolved.assignment.name)
        prepared, counts = asyncio.run(_prepare_and_count(llama, digest.load(), batch.seeds))
        slot_ctx = prepared.endpoints[0].ctx or settings.llama_ctx // prepared.endpoints[0].slots
        limit = slot_ctx - prepared.digest_tokens - config.answer_budget_tokens
        fitting = quarantine_overlong(batch.seeds, counts, limit)
        seeds = fitting.seeds
        quarantined += [*batch.quarantined, *fitting.quarantined]
    store = warehouse.warehouse()
    if True:  # LEASE: the partition lease lands with the engine's ledger leases
        written = store.write_partition(
            "seeds",
            ds,
            source,
            seed_rows(
                seeds,
                input_sha256=resolved.version.sha256 if resolved.version else "",
                created_at=now,
                token_counts=counts,
            ),
        )
        replace_quarantine(store, ds, source, "input", quarantined)
    check = publish(context, trino, store, ["seeds", "quarantine"], ds, source)
    return dg.MaterializeResult(
        metadata={
            "rows": written.rows,
            "quarantined": len(quarantined),
            "source_file": resolved.assignment.name,
            "input_sha256": resolved.version.sha256 if resolved.version else "none",
            "read_from": "inbox" if resolved.from_inbox else "landed snapshot",
            "prompt_token_limit": limit,
            "path": dg.MetadataValue.path(str(written.path)),
        },
        check_results=[check],
    )


async def _prepare_and_count(
    llama: LlamaServerResource, loaded: SystemDigest, seeds: Sequence[SeedPrompt]
) -> tuple[Prepared, dict[str, int]]:
    prepared = await llama.prepare(loaded)
    return prepared, await _token_counts(llama.client(), seeds)


def _seeds(warehouse: WarehouseResource, ds: str, source: str) -> list[SeedPrompt]:
    """The partition's landed seeds (table `seeds`), never the inbox file."""
    return seeds_from_rows(read_rows(warehouse.warehouse(), "seeds", ds, source, SeedRow))


@dg.asset(
    partitions_def=batch_partitions,
    group_name=BATCH_GROUP,
    pool=LLAMA_POOL,
    kinds={"parquet", "trino"},
    check_specs=check_specs("amplified_prompts"),
    deps=[seed_prompts],
)
def amplified_prompts(
    context: dg.AssetExecutionContext,
    config: AmplifyConfig,
    llama: LlamaServerResource,
    digest: DigestResource,
    warehouse: WarehouseResource,
    trino: TrinoResource,
) -> dg.MaterializeResult:
    """New training prompts: k paraphrased, harder and related variants per seed, deduplicated."""
    ds, source = partition_parts(context)
    seeds = _seeds(warehouse, ds, source)
    params = SamplingParams(
        max_tokens=config.max_tokens, temperature=config.temperature, seed=config.seed
    )
    strategies = [Strategy(s) for s in config.strategies]
    requests = amplification_requests(seeds, strategies, config.variants_per_strategy, params)
    outcome = run_batch(context, llama, digest, warehouse, requests)
    amplified = to_amplified_rows(iter_batch_results(warehouse, outcome), seeds)
    return land_outputs(
        context,
        table="amplified",
        stage="amplify",
        rows=amplified.rows,
        texts=[row.prompt for row in amplified.rows],
        set_aside=amplified.quarantined,
        outcome=outcome,
        warehouse=warehouse.warehouse(),
        trino=trino,
        ds=ds,
        source=source,
        extra_metadata={"duplicates_dropped": amplified.duplicates},
    )


@dg.asset(
    partitions_def=batch_partitions,
    group_name=BATCH_GROUP,
    pool=LLAMA_POOL,
    deps=[seed_prompts, amplified_prompts],
    kinds={"parquet", "trino"},
    check_specs=check_specs("distilled_responses"),
)
def distilled_responses(
    context: dg.AssetExecutionContext,
    config: DistillConfig,
    llama: LlamaServerResource,
    digest: DigestResource,
    warehouse: WarehouseResource,
    trino: TrinoResource,
) -> dg.MaterializeResult:
    """Teacher answers for every seed and variant, with token counts, cache hits and timings."""
    ds, source = partition_parts(context)
    store = warehouse.warehouse()
    seeds = _seeds(warehouse, ds, source)
    variants = read_rows(store, "amplified", ds, source, AmplifiedRow)
    params = SamplingParams(
        max_tokens=config.max_tokens, temperature=config.temperature, seed=config.seed
    )
    allowed = llama.settings().output_model_modules
    output_model = _import_model(config.output_model, allowed) if config.output_model else None
    requests = distillation_requests(
        seeds, variants, params, n_probs=config.n_probs, output_model=output_model
    )
    outcome = run_batch(context, llama, digest, warehouse, requests)
    distilled = to_distilled_rows(
        iter_batch_results(warehouse, outcome), seeds, variants, output_model=output_model
    )
    return land_outputs(
        context,
        table="distilled",
        stage="distill",
        rows=distilled.rows,
        texts=[row.response for row in distilled.rows],
        set_aside=distilled.quarantined,
        outcome=outcome,
        warehouse=store,
        trino=trino,
        ds=ds,
        source=source,
    )
