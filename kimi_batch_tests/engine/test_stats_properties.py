"""Properties of the token accounting of a finished answer: llama-server's usage and timings
(`kimi_batch.llama.responses`: `Timings`, `ChatUsage`, `_stats` through `ChatCompletion.stats`),
the ledger row the engine makes of an answer (`kimi_batch.engine.record.completion_result`) and
the batch's running sums (`kimi_batch.engine.stats.StatsAccumulator`).

- Any answer: whatever integers (of any sign) and floats (negative, NaN, huge) its usage,
  timings and slot fields hold, its `GenerationStats` builds and the engine's ledger row of it
  builds, with the answer's text: a count no server can mean (negative, or a duration that is
  NaN or negative) is read as absent, never a `ValidationError` that ends the run. Cached and
  evaluated tokens stay within the prompt tokens; a count that is possible is kept as sent.
- Streamed alike: the same counts in the last chunk of a streamed answer read the same.
- Sums: the accumulator's totals are the sums of what it was given, evaluated = prompt - cached,
  its cache-hit ratio the smallest per-request ratio in [0, 1], its summary's rates finite and
  non-negative, its latency percentiles within the latencies given (p50 <= p95).
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kimi_batch.engine.generation import GenerationRequest, GenerationResult, SamplingParams
from kimi_batch.engine.outcome import PlannedRequest
from kimi_batch.engine.record import completion_result
from kimi_batch.engine.stats import StatsAccumulator
from kimi_batch.llama import ChatCompletion
from kimi_batch.llama.chat_stream import read_chat_stream
from kimi_batch.llama.messages import ChatMessage
from kimi_batch_tests.support.results import chat_body

EXAMPLES = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

ITEM = PlannedRequest(
    request_id="r1",
    content_key="k1",
    request=GenerationRequest(
        input_id="in1", messages=[ChatMessage(role="user", content="question")]
    ),
    params=SamplingParams(max_tokens=4, temperature=0.0),
)


def _record(completion: ChatCompletion) -> GenerationResult:
    """The ledger row the engine's `_record` makes of `completion`."""
    return completion_result(
        ITEM,
        completion,
        model="m",
        digest_sha256="d" * 64,
        endpoint="http://127.0.0.1:1",
        slot_id=0,
        latency_ms=1.0,
    )


def _parse(body: dict[str, Any]) -> ChatCompletion:
    """A body sent whole, as `LlamaClient._parse` reads it (JSON text: NaN written as NaN)."""
    return ChatCompletion.model_validate_json(json.dumps(body))


def _streamed(body: dict[str, Any]) -> ChatCompletion:
    """The same answer streamed: its text in one chunk, its usage and timings in the last."""
    first = {
        "choices": [{"index": 0, "delta": {"content": body["choices"][0]["message"]["content"]}}]
    }
    finish = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    last = {"choices": [], **{k: v for k, v in body.items() if k != "choices"}}

    async def lines() -> AsyncIterator[str]:
        for event in (first, finish, last):
            yield f"data: {json.dumps(event)}"
            yield ""
        yield "data: [DONE]"
        yield ""

    return asyncio.run(read_chat_stream(lines(), "http://127.0.0.1:1"))


# ---- regression: impossible counts --------------------------------------------------------------


def _with(
    usage: dict[str, Any] | None = None, timings: dict[str, Any] | None = None
) -> dict[str, Any]:
    body = chat_body("kept")
    body["usage"] |= usage or {}
    body["timings"] |= timings or {}
    return body


IMPOSSIBLE = [
    _with(timings={"prompt_n": -1}),
    _with(timings={"predicted_n": -2}),
    _with(timings={"prompt_ms": -1.0}),
    _with(timings={"predicted_ms": math.nan}),
    _with(timings={"draft_n": -1, "draft_n_accepted": -1}),
    _with(usage={"completion_tokens": -3}, timings={"predicted_n": 0}),
]


@pytest.mark.parametrize("body", IMPOSSIBLE)
def test_an_answer_with_a_negative_or_nan_count_is_recorded_with_that_count_absent(
    body: dict[str, Any],
) -> None:
    # ik_llama.cpp or another fork may send what llama.cpp never does; `stats` raised pydantic's
    # ValidationError inside the engine's `_record`, which nothing caught: the run ended.
    for completion in (_parse(body), _streamed(body)):
        result = _record(completion)
        assert result.text == "kept"
        assert result.prompt_tokens >= result.cached_tokens >= 0
        assert result.completion_tokens >= 0
        assert result.prompt_ms >= 0
        assert result.predicted_ms >= 0
        assert result.draft_tokens is None or result.draft_tokens >= 0


def test_a_cached_count_past_any_float_is_a_full_cache_hit_not_an_overflow() -> None:
    # JSON holds any integer and the ledger keeps it; the cache-hit ratio divided it as a float
    # (OverflowError) inside the engine's `_record`, after the ledger kept the row: the run ended.
    body = _with(timings={"cache_n": 10**400})
    accumulator = StatsAccumulator(100)
    accumulator.add(_record(_parse(body)))
    assert accumulator.min_cache_ratio == 1.0
    assert accumulator.cached_tokens == 10**400


# ---- any answer ---------------------------------------------------------------------------------

# Any integer a JSON body can hold (past 64 bits too), small ones near zero and -1 most often.
ANY_COUNT = st.one_of(st.integers(-3, 40), st.integers(-(1 << 70), 1 << 70))
# Finite floats of any sign and NaN (JSON's NaN, which the client's parser accepts). An infinite
# duration is the ledger's to refuse (`UnstorableResultError`, test_ledger_properties).
ANY_MS = st.one_of(st.floats(allow_infinity=False), st.just(math.nan), st.just(-1.0))
USAGE = st.fixed_dictionaries(
    {},
    optional={
        "prompt_tokens": ANY_COUNT,
        "completion_tokens": ANY_COUNT,
        "total_tokens": ANY_COUNT,
        "prompt_tokens_details": st.fixed_dictionaries({}, optional={"cached_tokens": ANY_COUNT}),
    },
)
TIMINGS = st.fixed_dictionaries(
    {},
    optional={
        "prompt_n": ANY_COUNT,
        "prompt_ms": ANY_MS,
        "predicted_n": ANY_COUNT,
        "predicted_ms": ANY_MS,
        "cache_n": ANY_COUNT,
        "n_past": ANY_COUNT,
        "draft_n": ANY_COUNT,
        "draft_n_accepted": ANY_COUNT,
        "prompt_per_second": ANY_MS,
    },
)
SLOT = st.fixed_dictionaries({}, optional={"n_past": ANY_COUNT, "tokens_cached": ANY_COUNT})


def _body(
    usage: dict[str, Any] | None, timings: dict[str, Any] | None, slot: dict[str, Any]
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"content": "kept"}}],
        **slot,
    }
    if usage is not None:
        body["usage"] = usage
    if timings is not None:
        body["timings"] = timings
    return body


def _possible(value: Any) -> bool:
    return value is not None and value >= 0


@EXAMPLES
@given(usage=st.none() | USAGE, timings=st.none() | TIMINGS, slot=SLOT)
def test_any_answer_s_counts_give_stats_and_a_ledger_row(
    usage: dict[str, Any] | None, timings: dict[str, Any] | None, slot: dict[str, Any]
) -> None:
    body = _body(usage, timings, slot)
    whole = _parse(body)
    stats = whole.stats
    assert stats.cached_tokens + stats.evaluated_tokens <= stats.prompt_tokens
    timed = timings or {}
    # A possible count is kept as sent, an impossible one is read as absent (its default).
    prompt_n = timed.get("prompt_n", 0)
    assert stats.evaluated_tokens == (prompt_n if _possible(prompt_n) else 0)
    if _possible(timed.get("cache_n")):
        assert stats.cached_tokens == timed["cache_n"]  # llama.cpp's own count first
    for name in ("prompt_ms", "predicted_ms"):
        sent = timed.get(name, 0.0)
        assert getattr(stats, name) == (sent if _possible(sent) else 0.0)
    for name, field in (("draft_n", "draft_tokens"), ("draft_n_accepted", "draft_accepted_tokens")):
        sent = timed.get(name)
        assert getattr(stats, field) == (sent if _possible(sent) else None)
    if usage is not None and _possible(usage.get("prompt_tokens")):
        assert stats.prompt_tokens >= usage["prompt_tokens"]
    predicted = timed.get("predicted_n", 0)
    if _possible(predicted) and predicted > 0:
        assert stats.completion_tokens == predicted
    result = _record(whole)
    assert result.text == "kept"
    assert (result.prompt_tokens, result.cached_tokens, result.completion_tokens) == (
        stats.prompt_tokens,
        stats.cached_tokens,
        stats.completion_tokens,
    )
    # Streamed, the same counts in the last chunk read the same.
    assert _streamed(body).stats == stats


# ---- the batch's sums ---------------------------------------------------------------------------

TOKENS = st.integers(0, 1 << 40)
# None, or at least a microsecond (llama.cpp's clock): a subnormal time overflows a rate.
MS = st.one_of(st.just(0.0), st.floats(min_value=1e-3, max_value=1e12))


@st.composite
def results(draw: st.DrawFn) -> GenerationResult:
    prompt = draw(TOKENS)
    return GenerationResult(
        request_id=draw(st.text(max_size=3)),
        input_id="in",
        tag="t",
        model="m",
        digest_sha256="d" * 64,
        text=draw(st.sampled_from(["", " ", "a"])),
        finish_reason=draw(st.sampled_from(["stop", "length", "tool_calls"])),
        prompt_tokens=prompt,
        cached_tokens=draw(st.integers(0, prompt)),
        completion_tokens=draw(TOKENS),
        prompt_ms=draw(MS),
        predicted_ms=draw(MS),
        latency_ms=draw(MS),
        endpoint="http://127.0.0.1:1",
        slot_id=0,
        logprobs=None,
        created_at=draw(st.datetimes()),
    )


@EXAMPLES
@given(
    added=st.lists(st.tuples(results(), st.none() | st.integers(0, 1 << 20)), max_size=30),
    default_digest=st.integers(0, 1 << 20),
    wall_s=st.one_of(st.just(0.0), st.floats(min_value=1e-3, max_value=1e9)),
)
def test_the_accumulator_sums_what_it_was_given(
    added: list[tuple[GenerationResult, int | None]], default_digest: int, wall_s: float
) -> None:
    accumulator = StatsAccumulator(default_digest)
    for result, digest in added:
        accumulator.add(result, digest_tokens=digest)
    given_results = [result for result, _ in added]
    summary = accumulator.summary(
        total=len(added),
        from_ledger=0,
        failed=0,
        not_started=0,
        clamped=0,
        digest_reprefills=0,
        hangs=0,
        max_in_flight=1,
        wall_s=wall_s,
    )
    assert summary.generated == len(added)
    assert summary.prompt_tokens == sum(r.prompt_tokens for r in given_results)
    assert summary.cached_tokens == sum(r.cached_tokens for r in given_results)
    assert summary.completion_tokens == sum(r.completion_tokens for r in given_results)
    assert summary.evaluated_tokens == summary.prompt_tokens - summary.cached_tokens
    assert summary.truncated == sum(r.finish_reason == "length" for r in given_results)
    assert summary.empty == sum(r.empty for r in given_results)
    ratios = [
        min(r.cached_tokens / expected, 1.0)
        for r, digest in added
        if (expected := default_digest if digest is None else digest)
    ]
    assert summary.cache_hit_ratio == min(ratios, default=1.0)
    assert 0.0 <= summary.cache_hit_ratio <= 1.0
    for rate in (summary.prompt_tokens_per_s, summary.completion_tokens_per_s):
        assert math.isfinite(rate)
        assert rate >= 0
    latencies = [r.latency_ms for r in given_results]
    if latencies:
        # statistics.quantiles interpolates: equal latencies come back within rounding.
        slack = 1e-12 * max(latencies)
        assert min(latencies) - slack <= summary.latency_p50_ms
        assert summary.latency_p50_ms <= summary.latency_p95_ms + slack
        assert summary.latency_p95_ms <= max(latencies) + slack
    else:
        assert summary.latency_p50_ms == summary.latency_p95_ms == 0.0
