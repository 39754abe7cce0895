"""The time-scaled stand-in of the target: its cost model and the API subset the engine uses.

No llama-server: the stand-in is the thing under test (a simulator for planning, never a
substitute in tests of server behaviour). Assertions are on the target times it reports.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kimi_batch.engine import (
    BatchEngine,
    GenerationRequest,
    Ledger,
    SamplingParams,
    SystemDigest,
    prepare,
)
from kimi_batch.llama import ChatMessage, LlamaClient
from kimi_batch_bench.standin import StandinServer, TargetProfile
from kimi_batch_tests.support.ports import free_port

DIGEST = SystemDigest.from_text("You answer questions about caching. " * 40)


def test_the_cost_model_reproduces_the_source_documents_measurements() -> None:
    profile = TargetProfile()

    assert profile.prefill_cost(0, 16148) / 60 == pytest.approx(43.8, rel=0.02)
    assert 823 / profile.prefill_cost(0, 823) == pytest.approx(22.24, rel=0.02)
    assert 356 / profile.prefill_cost(16148, 356) == pytest.approx(3.4, rel=0.05)
    assert 1 / profile.decode_step_cost([1000]) == pytest.approx(10.27, rel=0.05)
    assert 1 / profile.decode_step_cost([16500]) == pytest.approx(2.3, rel=0.1)
    # Four slots share the weight passes: more in aggregate, less each.
    four = 4 / profile.decode_step_cost([1000] * 4)
    assert 1 / profile.decode_step_cost([1000]) < four < 4 / profile.decode_step_cost([1000])


async def _chat(client: LlamaClient, text: str, slot: int) -> tuple[int, int, int, str, float]:
    completion = await client.chat(
        [ChatMessage(role="system", content=DIGEST.text), ChatMessage(role="user", content=text)],
        max_tokens=40,
        slot_id=slot,
    )
    stats = completion.stats
    return (
        stats.cached_tokens,
        stats.evaluated_tokens,
        stats.completion_tokens,
        completion.text,
        stats.prompt_ms,
    )


def test_prefix_reuse_slot_saves_and_answers_of_the_asked_length() -> None:
    async def scenario(url: str) -> None:
        async with LlamaClient(url) as client:
            digest_tokens = len(await client.tokenize(DIGEST.text))
            cold = await _chat(client, "first question", 0)
            warm = await _chat(client, "second question", 0)
            again = await _chat(client, "second question", 1)
            await client.save_slot(0, "digest.bin")
            await client.erase_slot(1)
            await client.restore_slot(1, "digest.bin")
            restored = await _chat(client, "third question", 1)
            metrics = await client.metrics()
            slots = await client.slots()

        assert cold[0] == 0
        assert cold[1] > digest_tokens
        assert warm[0] >= digest_tokens
        assert warm[1] < 30
        assert again[0] == 0  # another slot does not share the first one's KV
        assert restored[0] >= digest_tokens  # ... until the saved digest is restored into it
        assert warm[2] == 40
        assert len(warm[3].split()) == 40
        assert warm[3] == again[3]  # deterministic: same prompt, same answer
        assert cold[4] > warm[4] * 10  # target milliseconds: a prefill costs, a reuse does not
        assert metrics.tokens_predicted_total == 4 * 40
        assert [slot.is_processing for slot in slots] == [False, False]

    with StandinServer(port=free_port(), slots=2, ctx=8192, time_scale=1000) as server:
        asyncio.run(scenario(server.base_url))


def test_the_engine_runs_a_batch_on_it_with_the_digest_warm(tmp_path: Path) -> None:
    params = SamplingParams(max_tokens=32, temperature=0.0)
    requests = [
        GenerationRequest(
            input_id=f"row-{i}",
            messages=[ChatMessage(role="user", content=f"question {i} about caches")],
            params=params,
        )
        for i in range(8)
    ]

    async def scenario(url: str) -> None:
        prepared = await prepare([url], model="standin", digest=DIGEST)
        with Ledger(tmp_path / "ledger.sqlite3") as ledger:
            engine = BatchEngine(
                prepared.endpoints, DIGEST, ledger, digest_tokens=prepared.digest_tokens
            )
            outcome = await engine.run(requests)
            results = list(outcome.iter_results(ledger))

        assert outcome.stats.generated == 8
        assert not outcome.failures
        assert outcome.stats.digest_reprefills == 0
        assert all(r.cached_tokens >= prepared.digest_tokens for r in results)

    with StandinServer(port=free_port(), slots=4, ctx=16384, time_scale=2000) as server:
        asyncio.run(scenario(server.base_url))
        assert server.sim is not None
        assert server.sim.busy_target_s > 0
