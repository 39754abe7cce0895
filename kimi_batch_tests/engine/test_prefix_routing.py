"""The engine routes requests sharing a prefix to one slot, back to back (real llama-server)."""

from __future__ import annotations

from collections import defaultdict
from itertools import pairwise
from pathlib import Path

import pytest

from kimi_batch.engine import BatchEngine, GenerationResult, Ledger
from kimi_batch.llama import ResidentServer
from kimi_batch_bench.contenders import BenchTarget, run_all_slots
from kimi_batch_bench.workloads import amplify_workload
from kimi_batch_tests.support.engine import digest_tokens, endpoint_of, fresh_digest

pytestmark = pytest.mark.slow  # a real llama-server


def _by_slot(results: list[GenerationResult]) -> dict[int | None, list[GenerationResult]]:
    lanes: dict[int | None, list[GenerationResult]] = defaultdict(list)
    for result in sorted(results, key=lambda r: r.created_at):
        lanes[result.slot_id].append(result)
    return lanes


async def test_variants_of_a_seed_run_back_to_back_and_evaluate_fewer_prompt_tokens(
    shared_server: ResidentServer, tmp_path: Path
) -> None:
    # 4 seeds x 3 strategies x 1 variant; seeds are 150-400 tokens of real code. One seed a
    # slot, three requests each: two followers per seed show the back-to-back reuse as well as
    # five did, at half the prompt tokens (the client side evaluates every seed in full).
    workload = amplify_workload(tmp_path / "seeds.jsonl", seeds=4, variants=1, output_tokens=4)
    # Separate digests: neither run can find the other's prompts in the RAM prompt cache.
    # Its first sections only: what is asserted is where the digest's tokens are reused.
    engine_digest = fresh_digest("route-engine", sections=1)
    client_digest = fresh_digest("route-client", sections=1)
    tokens = await digest_tokens(shared_server, engine_digest)
    endpoint = endpoint_of(shared_server)

    with Ledger(tmp_path / "ledger.sqlite3") as ledger:
        outcome = await BatchEngine([endpoint], engine_digest, ledger, digest_tokens=tokens).run(
            workload.requests
        )
        results = list(outcome.iter_results(ledger))
    client = await run_all_slots(
        BenchTarget(
            endpoint=endpoint,
            digest=client_digest,
            digest_tokens=await digest_tokens(shared_server, client_digest),
        ),
        workload.requests,
    )

    assert not outcome.failures
    for lane in _by_slot(results).values():
        seeds = [r.input_id for r in lane]
        # Each seed's requests are one contiguous run on a slot (a stolen half is its own run).
        runs = [seed for i, seed in enumerate(seeds) if i == 0 or seeds[i - 1] != seed]
        assert len(runs) == len(set(runs)), seeds
        for previous, current in pairwise(lane):
            if previous.input_id == current.input_id:
                # The follower found the digest and the whole seed in the slot's KV.
                assert current.cached_tokens >= tokens + 100, (previous, current)
    assert outcome.stats.evaluated_tokens < client.prompt_tokens_evaluated
