"""The contenders of `kimi-batch bench`, each timed on the same server, prompts and lengths.

(A) naive: one request after another, unpinned, no warm-up, as a first script does.
(B) the all-slots client: every slot busy, the digest warm, each request pinned, input order.
(C) the engine: `BatchEngine.run`, its warm-up timed separately.
(D) Dagster: `seed_prompts` + `distilled_responses` of one partition on a real instance.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from kimi_batch.engine import (
    BatchEngine,
    Endpoint,
    GenerationRequest,
    Ledger,
    SlotWarmer,
    SystemDigest,
    assemble_messages,
    load_digest,
)
from kimi_batch.llama import LlamaClient
from kimi_batch.settings import Settings
from kimi_batch_bench.errors import BenchError
from kimi_batch_bench.measure import ContenderReport, PeakRss, RequestRecord, summarize_contender

__all__ = [
    "BenchTarget",
    "bench_target",
    "erase_slots",
    "run_all_slots",
    "run_dagster",
    "run_engine",
    "run_naive",
]


class BenchTarget(BaseModel):
    """The server under test and the digest every contender uses."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    endpoint: Endpoint
    digest: SystemDigest
    digest_tokens: int


async def bench_target(base_url: str, model: str, digest_path: Path) -> BenchTarget:
    """The server's slots and context, and the digest counted with its tokenizer."""
    digest = load_digest(digest_path)
    async with LlamaClient(base_url) as client:
        props = await client.props()
        digest_tokens = len(await client.tokenize(digest.text))
    endpoint = Endpoint(base_url=base_url, slots=props.total_slots, model=model, ctx=props.n_ctx)
    return BenchTarget(endpoint=endpoint, digest=digest, digest_tokens=digest_tokens)


async def erase_slots(target: BenchTarget) -> None:
    """Start every contender from empty slots (no KV left behind by the previous one)."""
    async with LlamaClient(target.endpoint.base_url) as client:
        for slot_id in range(target.endpoint.slots):
            await client.erase_slot(slot_id)


async def _send(
    client: LlamaClient, target: BenchTarget, request: GenerationRequest, slot_id: int | None
) -> RequestRecord:
    params = request.params
    sent = time.perf_counter()
    completion = await client.chat(
        assemble_messages(target.digest, request.messages),
        max_tokens=params.max_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        seed=params.seed,
        slot_id=slot_id,
    )
    return RequestRecord.from_stats(completion.stats, (time.perf_counter() - sent) * 1000)


async def run_naive(target: BenchTarget, requests: Sequence[GenerationRequest]) -> ContenderReport:
    await erase_slots(target)
    rss = PeakRss()
    rss.reset()
    started = time.perf_counter()
    async with LlamaClient(target.endpoint.base_url) as client:
        records = [await _send(client, target, request, None) for request in requests]
    wall = time.perf_counter() - started
    return summarize_contender(
        "naive", records, wall_s=wall, digest_tokens=target.digest_tokens, peak_rss_mb=rss.peak_mb()
    )


async def run_all_slots(
    target: BenchTarget, requests: Sequence[GenerationRequest]
) -> ContenderReport:
    await erase_slots(target)
    endpoint = target.endpoint
    async with LlamaClient(endpoint.base_url) as client:
        warmer = SlotWarmer(
            client,
            target.digest,
            digest_tokens=target.digest_tokens,
            model=endpoint.model,
            ctx=endpoint.ctx,
        )
        warm_started = time.perf_counter()
        await warmer.warm_all(endpoint.slots, verify=False)
        warmup = time.perf_counter() - warm_started
        queue = deque(requests)
        records: list[RequestRecord] = []

        async def worker(slot_id: int) -> None:
            while queue:
                records.append(await _send(client, target, queue.popleft(), slot_id))

        rss = PeakRss()
        rss.reset()
        started = time.perf_counter()
        await asyncio.gather(*(worker(slot_id) for slot_id in range(endpoint.slots)))
        wall = time.perf_counter() - started
    return summarize_contender(
        "all_slots",
        records,
        wall_s=wall,
        warmup_s=warmup,
        digest_tokens=target.digest_tokens,
        peak_rss_mb=rss.peak_mb(),
    )


async def run_engine(
    target: BenchTarget, requests: Sequence[GenerationRequest], ledger_path: Path
) -> ContenderReport:
    """The engine on an empty ledger (the caller's to remove); its warm-up is reported apart."""
    await erase_slots(target)
    rss = PeakRss()
    rss.reset()
    with Ledger(ledger_path) as ledger:
        engine = BatchEngine(
            [target.endpoint], target.digest, ledger, digest_tokens=target.digest_tokens
        )
        outcome = await engine.run(requests)
        records = [RequestRecord.from_result(r) for r in outcome.iter_results(ledger)]
    if outcome.failures:
        raise BenchError(f"engine failed {len(outcome.failures)} bench requests")
    warmup = sum(w.prefill_ms + w.save_ms + w.restore_ms for w in outcome.warmups) / 1000
    return summarize_contender(
        "engine",
        records,
        wall_s=outcome.stats.wall_s - warmup,
        warmup_s=warmup,
        digest_tokens=target.digest_tokens,
        peak_rss_mb=rss.peak_mb(),
        reprefills=outcome.stats.digest_reprefills,
    )


class DagsterRun(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    wall_s: float
    rows: int
    peak_rss_mb: float


def run_dagster(settings: Settings, inbox_name: str, max_tokens: int, seed: int) -> DagsterRun:
    """Materialize the partition of inbox file `inbox_name` on a throwaway instance.

    The resources are built from `settings`, which the caller points at the bench server. The
    ledger is emptied first so every row is generated, as the engine contender's are.
    """
    import dagster as dg

    from kimi_batch.definitions import batch_assets, build_resources
    from kimi_batch.defs.partitions import DATE_DIMENSION, SOURCE_DIMENSION, SOURCE_PARTITIONS_NAME
    from kimi_batch.inputs import Landing
    from kimi_batch.pipeline import DISTILL, SEED_ASSET

    if settings.paths.warehouse_url is not None:
        # The bench empties its warehouse between contenders: a folder of its own, never a
        # shared object store.
        raise BenchError(
            f"the benchmark needs a warehouse folder, not {settings.paths.warehouse_url}: "
            "unset KIMI_BATCH_WAREHOUSE for it"
        )
    shutil.rmtree(settings.paths.ledger_dir, ignore_errors=True)
    shutil.rmtree(settings.paths.warehouse_dir, ignore_errors=True)
    with Landing(settings.paths) as landing:
        assigned = landing.assign_inbox(
            settings.paths.inbox_dir,
            arrived=settings.today(),
            start=settings.first_partition_date(),
        )
    files = [a for a in assigned if a.name == inbox_name]
    if not files:
        raise FileNotFoundError(f"bench inbox file {inbox_name} not found by the inbox scan")
    key = dg.MultiPartitionKey({DATE_DIMENSION: files[0].ds, SOURCE_DIMENSION: files[0].source})
    config = {"max_tokens": max_tokens, "temperature": 0.7, "seed": seed}
    rss = PeakRss()
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(SOURCE_PARTITIONS_NAME, [files[0].source])
        resources = build_resources(settings)
        rss.reset()
        started = time.perf_counter()
        result = dg.materialize(
            batch_assets(settings),
            selection=[SEED_ASSET, DISTILL.asset],
            partition_key=key,
            resources=resources,
            instance=instance,
            run_config={"ops": {DISTILL.asset: {"config": config}}},
        )
        wall = time.perf_counter() - started
    materialized = result.asset_materializations_for_node(DISTILL.asset)
    # Generated requests, not table rows: with --ignore-eos every answer stops at max_tokens and
    # is set aside (never a final answer), yet its tokens were generated all the same.
    rows = int(materialized[-1].metadata["generated"].value) if materialized else 0  # type: ignore[arg-type]
    return DagsterRun(wall_s=wall, rows=rows, peak_rss_mb=rss.peak_mb())
