"""Partitioned batch assets: seeds from the inbox, amplified variants, distilled teacher answers."""

import asyncio
import importlib
from pathlib import Path

import dagster as dg
from pydantic import BaseModel, Field

from kimi_batch.defs.assets._generation import (
    BATCH_GROUP,
    LLAMA_POOL,
    check_specs,
    iter_batch_results,
    land_outputs,
    read_rows,
    replace_quarantine,
    run_batch,
)
from kimi_batch.defs.partitions import batch_partitions, partition_parts
from kimi_batch.defs.resources.digest import DigestResource
from kimi_batch.defs.resources.llama import LlamaServerResource
from kimi_batch.defs.resources.trino import TrinoResource
from kimi_batch.defs.resources.warehouse import WarehouseResource
from kimi_batch.engine.requests import SamplingParams
from kimi_batch.llama.client import LlamaClient
from kimi_batch.storage.inbox import resolve_source_file
from kimi_batch.tasks.amplify import Strategy, amplification_requests, to_amplified_rows
from kimi_batch.tasks.distill import distillation_requests, to_distilled_rows
from kimi_batch.tasks.inputs import SeedPrompt, quarantine_overlong, read_inbox_file
from kimi_batch.tasks.rows import AmplifiedRow

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


def _import_model(path: str) -> type[BaseModel]:
    module_name, _, name = path.partition(":")
    try:
        found = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError) as error:
        raise dg.Failure(f"output_model {path!r} cannot be imported: {error}") from error
    if not (isinstance(found, type) and issubclass(found, BaseModel)):
        raise dg.Failure(f"output_model {path!r} is not a pydantic model")
    return found


async def _token_counts(
    client: LlamaClient, digest_text: str, seeds: list[SeedPrompt]
) -> tuple[int, dict[str, int]]:
    """Tokens of the digest and of each seed's user side, in one client session."""
    async with client:
        digest_tokens = len(await client.tokenize(digest_text))
        counts = {
            s.input_id: len(await client.tokenize("\n".join(m.content for m in s.messages)))
            for s in seeds
        }
    return digest_tokens, counts


@dg.asset(partitions_def=batch_partitions, group_name=BATCH_GROUP, kinds={"python"})
def seed_prompts(
    context: dg.AssetExecutionContext,
    config: SeedConfig,
    llama: LlamaServerResource,
    digest: DigestResource,
    warehouse: WarehouseResource,
) -> dg.Output[list[SeedPrompt]]:
    """Validated input rows of one inbox file; bad rows go to quarantine with the reason."""
    ds, source = partition_parts(context)
    path = resolve_source_file(Path(llama.home) / "inbox", ds, source)  # the state dir's inbox
    batch = read_inbox_file(path)
    endpoint = llama.endpoints()[0]
    digest_tokens, counts = asyncio.run(
        _token_counts(llama.client(), digest.load().text, batch.seeds)
    )
    slot_ctx = endpoint.ctx or llama.ctx // endpoint.slots
    limit = slot_ctx - digest_tokens - config.answer_budget_tokens
    fitting = quarantine_overlong(batch.seeds, counts, limit)
    quarantined = [*batch.quarantined, *fitting.quarantined]
    replace_quarantine(warehouse.warehouse(), ds, source, "input", quarantined)
    return dg.Output(
        fitting.seeds,
        metadata={
            "rows": len(fitting.seeds),
            "quarantined": len(quarantined),
            "source_file": dg.MetadataValue.path(str(path)),
            "prompt_token_limit": limit,
        },
    )


@dg.asset(
    partitions_def=batch_partitions,
    group_name=BATCH_GROUP,
    pool=LLAMA_POOL,
    kinds={"parquet", "trino"},
    check_specs=check_specs("amplified_prompts"),
)
def amplified_prompts(
    context: dg.AssetExecutionContext,
    config: AmplifyConfig,
    seed_prompts: list[SeedPrompt],
    llama: LlamaServerResource,
    digest: DigestResource,
    warehouse: WarehouseResource,
    trino: TrinoResource,
) -> dg.MaterializeResult:
    """New training prompts: k paraphrased, harder and related variants per seed, deduplicated."""
    ds, source = partition_parts(context)
    params = SamplingParams(
        max_tokens=config.max_tokens, temperature=config.temperature, seed=config.seed
    )
    strategies = [Strategy(s) for s in config.strategies]
    requests = amplification_requests(
        seed_prompts, strategies, config.variants_per_strategy, params
    )
    outcome = run_batch(context, llama, digest, requests)
    amplified = to_amplified_rows(iter_batch_results(llama, outcome), seed_prompts)
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
    deps=[amplified_prompts],
    kinds={"parquet", "trino"},
    check_specs=check_specs("distilled_responses"),
)
def distilled_responses(
    context: dg.AssetExecutionContext,
    config: DistillConfig,
    seed_prompts: list[SeedPrompt],
    llama: LlamaServerResource,
    digest: DigestResource,
    warehouse: WarehouseResource,
    trino: TrinoResource,
) -> dg.MaterializeResult:
    """Teacher answers for every seed and variant, with token counts, cache hits and timings."""
    ds, source = partition_parts(context)
    store = warehouse.warehouse()
    variants = read_rows(store, "amplified", ds, source, AmplifiedRow)
    params = SamplingParams(
        max_tokens=config.max_tokens, temperature=config.temperature, seed=config.seed
    )
    output_model = _import_model(config.output_model) if config.output_model else None
    requests = distillation_requests(
        seed_prompts, variants, params, n_probs=config.n_probs, output_model=output_model
    )
    outcome = run_batch(context, llama, digest, requests)
    distilled = to_distilled_rows(
        iter_batch_results(llama, outcome), seed_prompts, variants, output_model=output_model
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
