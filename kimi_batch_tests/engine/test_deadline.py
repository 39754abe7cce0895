"""Per-request deadlines: long legitimate work is never cut, a small request gets the floor."""

from __future__ import annotations

from pathlib import Path

import pytest

from kimi_batch.engine.batch_engine import BatchEngine, Endpoint
from kimi_batch.engine.deadline import DeadlinePolicy, SpeedTracker, estimate_prompt_tokens
from kimi_batch.engine.digest import SystemDigest
from kimi_batch.engine.generation import GenerationRequest, GenerationResult, SamplingParams
from kimi_batch.engine.ledger import Ledger
from kimi_batch.engine.watchdog import WatchdogPolicy
from kimi_batch.llama.messages import ChatMessage
from kimi_batch_tests.support.results import make_result

MINUTE = 60.0
# The target: a 16k-token prompt takes ~44 minutes, a 1,024-token answer at 32k context ~7.
TARGET_PROMPT_TOKENS = 16_000
TARGET_PROMPT_S = 44 * MINUTE
TARGET_ANSWER_TOKENS = 1024
TARGET_ANSWER_S = 7 * MINUTE


def target_result(prompt_tokens: int, completion_tokens: int) -> GenerationResult:
    """A finished request at the target's measured speeds."""
    return make_result(
        prompt_tokens=prompt_tokens + 1000,
        cached_tokens=1000,
        completion_tokens=completion_tokens,
        prompt_ms=prompt_tokens / (TARGET_PROMPT_TOKENS / TARGET_PROMPT_S) * 1000,
        predicted_ms=completion_tokens / (TARGET_ANSWER_TOKENS / TARGET_ANSWER_S) * 1000,
    )


def test_a_44_minute_prompt_is_not_cut_at_the_defaults() -> None:
    tracker = SpeedTracker(DeadlinePolicy())
    needed = TARGET_PROMPT_S + TARGET_ANSWER_S
    assert tracker.deadline_s(TARGET_PROMPT_TOKENS, TARGET_ANSWER_TOKENS) > needed


def test_measured_target_speeds_still_leave_the_long_prompt_its_time() -> None:
    tracker = SpeedTracker(DeadlinePolicy())
    for _ in range(5):
        tracker.observe(target_result(2000, 200))
    deadline = tracker.deadline_s(TARGET_PROMPT_TOKENS, TARGET_ANSWER_TOKENS)
    assert deadline > TARGET_PROMPT_S + TARGET_ANSWER_S
    # ... and it is the multiplier, not an unbounded guess, that gives the margin.
    assert deadline < 3.5 * (TARGET_PROMPT_S + TARGET_ANSWER_S)


def test_a_small_request_gets_the_floor_not_less() -> None:
    tracker = SpeedTracker(DeadlinePolicy(floor_s=600.0))
    tracker.observe(make_result(prompt_tokens=1100, cached_tokens=1000, prompt_ms=100.0))
    assert tracker.deadline_s(20, 8) == 600.0


def test_faster_measured_speeds_shorten_the_deadline() -> None:
    policy = DeadlinePolicy(floor_s=1.0)
    tracker = SpeedTracker(policy)
    before = tracker.deadline_s(1000, 100)
    tracker.observe(
        make_result(
            prompt_tokens=1500,
            cached_tokens=1000,
            completion_tokens=100,
            prompt_ms=500.0,
            predicted_ms=2000.0,
        )
    )
    after = tracker.deadline_s(1000, 100)
    assert after < before
    # 1000 tokens at 1000 tok/s + 100 at 50 tok/s, times the default multiplier 3.
    assert after == 3 * (1000 / 1000 + 100 / 50)


def test_tiny_samples_do_not_move_the_speeds() -> None:
    tracker = SpeedTracker(DeadlinePolicy())
    tracker.observe(
        make_result(
            prompt_tokens=1003,
            cached_tokens=1000,
            completion_tokens=2,
            prompt_ms=0.1,
            predicted_ms=0.1,
        )
    )
    assert (tracker.prompt_tok_s, tracker.decode_tok_s) == (5.0, 1.0)


def test_prompt_estimate_counts_the_user_side_generously() -> None:
    messages = [ChatMessage(role="user", content="x" * 48_000)]
    assert estimate_prompt_tokens(messages, 3.0) >= TARGET_PROMPT_TOKENS


def test_a_slot_not_known_to_hold_the_digest_gets_time_to_prefill_it(tmp_path: Path) -> None:
    endpoint = Endpoint(base_url="http://llama", slots=1, model="m")
    with Ledger(tmp_path / "ledger.sqlite3") as ledger:
        engine = BatchEngine(
            [endpoint],
            SystemDigest.from_text("A long digest.\n"),
            ledger,
            digest_tokens=TARGET_PROMPT_TOKENS,
        )
        (item,) = engine.plan(
            [
                GenerationRequest(
                    input_id="q",
                    messages=[ChatMessage(role="user", content="Short question?")],
                    params=SamplingParams(max_tokens=TARGET_ANSWER_TOKENS),
                )
            ]
        )
        warm, cold = engine.deadline_s(item), engine.deadline_s(item, cold=True)
    assert cold > TARGET_PROMPT_S + TARGET_ANSWER_S
    assert warm < cold


def test_the_stall_period_is_600_s_until_a_prompt_speed_is_measured() -> None:
    seconds, why = WatchdogPolicy().stall_for(None, 2048)
    assert seconds == 600.0
    assert "no prompt speed" in why


@pytest.mark.parametrize(
    ("prompt_tok_s", "batch_tokens", "expected"),
    [
        (6.0, 2048, 1024.0),  # the target: 2,048-token batch at 6 tok/s, three of them
        (500.0, 2048, 60.0),  # a fast machine: the floor
        (50.0, 2048, 122.88),
    ],
)
def test_the_stall_period_is_three_full_batches_at_the_measured_speed(
    prompt_tok_s: float, batch_tokens: int, expected: float
) -> None:
    seconds, why = WatchdogPolicy().stall_for(prompt_tok_s, batch_tokens)
    assert seconds == pytest.approx(expected)
    assert f"{batch_tokens}-token batch" in why


def test_a_fixed_stall_period_wins() -> None:
    assert WatchdogPolicy(stall_s=30.0).stall_for(500.0, 2048) == (30.0, "fixed")


def test_only_a_measured_prompt_speed_counts() -> None:
    tracker = SpeedTracker(DeadlinePolicy())
    assert tracker.measured_prompt_tok_s is None
    tracker.observe(make_result(prompt_tokens=1000, cached_tokens=0, prompt_ms=2000.0))
    assert tracker.measured_prompt_tok_s == pytest.approx(500.0)
