"""What ik_llama.cpp's llama-server reports differently from llama.cpp's, read right.

The answers are its own, captured from a build of its source of 2026-08-15 (`/metrics` twice,
two seconds apart, while one slot generated; `/slots` then): CI does not build it (about 40
minutes here), so they are kept as text.
"""

from __future__ import annotations

import httpx

from kimi_batch.engine.watchdog import EndpointWatch, Probe, WatchdogPolicy
from kimi_batch.llama import LlamaClient
from kimi_batch.llama.server_state import ServerMetrics, SlotState

_METRICS = """# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 8
llamacpp:prompt_seconds_total 0.024
llamacpp:tokens_predicted_total 0
llamacpp:tokens_predicted_seconds_total 0
llamacpp:prompt_tokens_seconds 333.333
llamacpp:predicted_tokens_seconds 0
llamacpp:kv_cache_usage_ratio {ratio}
llamacpp:kv_cache_tokens {tokens}
llamacpp:requests_processing 1
llamacpp:requests_deferred 0
"""
WHILE_GENERATING = [
    _METRICS.format(ratio="0.041748", tokens=171),
    _METRICS.format(ratio="0.083252", tokens=341),
]
SLOTS = [
    {
        "id": 0,
        "id_task": 1,
        "n_ctx": 2048,
        "state": 1,
        "next_token": {"has_next_token": True, "n_remain": 65, "n_decoded": 335},
    },
    {
        "id": 1,
        "id_task": -1,
        "n_ctx": 2048,
        "state": 0,
        "next_token": {"has_next_token": True, "n_remain": -1, "n_decoded": 0},
    },
]


def test_a_slot_at_work_reads_as_processing_from_its_state() -> None:
    busy, idle = (SlotState.model_validate(slot) for slot in SLOTS)
    assert busy.is_processing
    assert busy.n_decoded == 335
    assert not idle.is_processing
    # llama.cpp's own field wins where a build reports both.
    assert not SlotState.model_validate({**SLOTS[0], "is_processing": False}).is_processing


async def test_the_watchdog_sees_generation_move_the_kv_cache_though_no_total_moves() -> None:
    answers = iter([*WHILE_GENERATING, WHILE_GENERATING[-1]])

    def metrics(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/metrics"
        return httpx.Response(200, text=next(answers))

    first, second = (ServerMetrics.parse(text) for text in WHILE_GENERATING)
    assert first.tokens_predicted_total == second.tokens_predicted_total == 0
    assert first.n_decode_total == second.n_decode_total == 0  # not reported
    async with LlamaClient(
        "http://ik-llama:8080", transport=httpx.MockTransport(metrics)
    ) as client:
        watch = EndpointWatch(client, WatchdogPolicy())
        assert await watch.probe() == Probe.PROGRESS  # the first sample
        assert await watch.probe() == Probe.PROGRESS  # 171 -> 341 tokens in the cache
        assert await watch.probe() == Probe.STILL  # nothing moved
