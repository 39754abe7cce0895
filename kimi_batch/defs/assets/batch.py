"""Partitioned batch assets: seeds from the inbox, amplified variants, distilled teacher answers."""

import asyncio
from pathlib import Path

import dagster as dg
from pydantic import Field

from kimi_batch.defs.assets._generation import (
    BATCH_GROUP,
    LLAMA_POOL,
    check_specs,
    failure_rows,
    generation_checks,
    generation_metadata,
    publish,
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


async def _token_counts(client: LlamaClient, seeds: list[SeedPrompt]) -> dict[str, int]:
    async with client:
        return {
            s.input_id: len(await client.tokenize("\n".join(m.content for m in s.messages)))
            for s in seeds
        }


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
    handle = llama.ensure_running()
    props = asyncio.run(_props(llama.client()))
    digest_tokens = digest.count_tokens(digest.load(), llama.client())
    limit = (props.n_ctx or llama.ctx // handle.slots) - digest_tokens - config.answer_budget_tokens
    counts = asyncio.run(_token_counts(llama.client(), batch.seeds))
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


async def _props(client: LlamaClient):
    async with client:
        return await client.props()


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
    amplified = to_amplified_rows(outcome.results, seed_prompts)
    failed = failure_rows(
        outcome.failures,
        stage="amplify",
        source_file=source,
        model=outcome.model,
        digest_sha=outcome.digest_sha256,
    )
    store = warehouse.warehouse()
    written = store.write_partition("amplified", ds, source, amplified.rows)
    quarantined = replace_quarantine(
        store, ds, source, "amplify", [*amplified.quarantined, *failed]
    )
    checks = generation_checks(
        "amplified", amplified.rows, [r.prompt for r in amplified.rows], written.path
    )
    checks.append(publish(context, trino, store, ["amplified", "quarantine"], ds, source))
    metadata = generation_metadata(
        outcome,
        rows=written.rows,
        quarantined=quarantined,
        table="amplified",
        path=written.path,
        trino=trino,
    )
    metadata["duplicates_dropped"] = amplified.duplicates
    return dg.MaterializeResult(metadata=metadata, check_results=checks)


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
    requests = distillation_requests(seed_prompts, variants, params, n_probs=config.n_probs)
    outcome = run_batch(context, llama, digest, requests)
    distilled = to_distilled_rows(outcome.results, seed_prompts, variants)
    failed = failure_rows(
        outcome.failures,
        stage="distill",
        source_file=source,
        model=outcome.model,
        digest_sha=outcome.digest_sha256,
    )
    written = store.write_partition("distilled", ds, source, distilled.rows)
    quarantined = replace_quarantine(
        store, ds, source, "distill", [*distilled.quarantined, *failed]
    )
    checks = generation_checks(
        "distilled", distilled.rows, [r.response for r in distilled.rows], written.path
    )
    checks.append(publish(context, trino, store, ["distilled", "quarantine"], ds, source))
    metadata = generation_metadata(
        outcome,
        rows=written.rows,
        quarantined=quarantined,
        table="distilled",
        path=written.path,
        trino=trino,
    )
    return dg.MaterializeResult(metadata=metadata, check_results=checks)
