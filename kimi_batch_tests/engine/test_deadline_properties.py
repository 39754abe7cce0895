"""Properties of a request's deadline (`kimi_batch.engine.deadline`): the policy's estimate at
the speeds measured so far, never under its floor.

- Any policy, any measurements handed in (a finished result's counts and durations, a digest
  prefill's tokens and milliseconds: zero, subnormal, negative, NaN, infinite, counts past any
  float), in any order: the tracker never raises, its speeds stay positive and finite, and every
  deadline is a number of seconds (not NaN) no smaller than the floor; finite whenever the
  durations handed in are under a century.
- Monotone: a larger prompt or a larger answer budget never gets a shorter deadline.
- Samples: a prompt sample of fewer than 32 evaluated tokens, a decode sample of fewer than 8,
  or one of no measured time leaves the speeds as they were; a first sample above them replaces
  the initial guess, a later one moves the average 30 % of the way.
"""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kimi_batch.engine.deadline import DeadlinePolicy, SpeedTracker
from kimi_batch_tests.support.results import make_result

EXAMPLES = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

POLICIES = st.builds(
    DeadlinePolicy,
    floor_s=st.floats(min_value=1e-6, max_value=1e6),
    multiplier=st.floats(min_value=1.0, max_value=100.0),
    prompt_tok_s=st.floats(min_value=1e-3, max_value=1e6),
    decode_tok_s=st.floats(min_value=1e-3, max_value=1e6),
)
# Counts a result or a prefill may carry: around the sample minimums, and past 64 bits.
COUNTS = st.one_of(st.integers(-5, 100), st.integers(0, 1 << 70))
# Durations in ms of any kind a caller might hand in.
ANY_MS = st.one_of(
    st.floats(),
    st.sampled_from([0.0, -1.0, math.nan, math.inf, 5e-324, 1e308]),
)
# What a finished result can hold (the model: non-negative counts and durations).
RESULT_MS = st.one_of(st.floats(min_value=0.0, allow_nan=False), st.sampled_from([0.0, 5e-324]))
REQUEST_TOKENS = st.integers(0, 1 << 40)
_CENTURY_MS = 100 * 365.25 * 24 * 3600 * 1000


@st.composite
def measurements(draw: st.DrawFn) -> tuple[str, int, int, float, float]:
    """("result", prompt, cached, prompt_ms, predicted_ms) or ("prefill", tokens, 0, ms, 0)."""
    if draw(st.booleans()):
        prompt = draw(st.integers(0, 1 << 70))
        cached = draw(st.integers(0, 1 << 70))
        return ("result", prompt, cached, draw(RESULT_MS), draw(RESULT_MS))
    return ("prefill", draw(COUNTS), 0, draw(ANY_MS), 0.0)


def _hand_in(tracker: SpeedTracker, seen: tuple[str, int, int, float, float]) -> None:
    kind, tokens, other, ms, more_ms = seen
    if kind == "result":
        tracker.observe(
            make_result(
                prompt_tokens=tokens,
                cached_tokens=other,
                completion_tokens=tokens // 3,
                prompt_ms=ms,
                predicted_ms=more_ms,
            )
        )
    else:
        tracker.observe_prompt(tokens, ms)


@EXAMPLES
@given(
    policy=POLICIES,
    seen=st.lists(measurements(), max_size=8),
    prompt=REQUEST_TOKENS,
    answer=REQUEST_TOKENS,
    more_prompt=REQUEST_TOKENS,
    more_answer=REQUEST_TOKENS,
)
def test_any_measurements_give_a_finite_deadline_at_least_the_floor_and_monotone(
    policy: DeadlinePolicy,
    seen: list[tuple[str, int, int, float, float]],
    prompt: int,
    answer: int,
    more_prompt: int,
    more_answer: int,
) -> None:
    tracker = SpeedTracker(policy)
    for one in seen:
        _hand_in(tracker, one)
        for speed in (tracker.prompt_tok_s, tracker.decode_tok_s):
            assert math.isfinite(speed)
            assert speed > 0
    deadline = tracker.deadline_s(prompt, answer)
    assert not math.isnan(deadline)
    assert deadline >= policy.floor_s
    if all(ms <= _CENTURY_MS for _, _, _, *durations in seen for ms in durations):
        # A sample of a few tokens over more than the age of the universe is a speed so close
        # to 0 that the estimate overflows; any duration a clock measured gives a finite one.
        assert math.isfinite(deadline)
    assert tracker.deadline_s(prompt + more_prompt, answer) >= deadline
    assert tracker.deadline_s(prompt, answer + more_answer) >= deadline


@EXAMPLES
@given(
    policy=POLICIES,
    first=st.tuples(st.integers(0, 10_000), st.floats(min_value=0.0, max_value=1e7)),
    second=st.tuples(st.integers(0, 10_000), st.floats(min_value=0.0, max_value=1e7)),
)
def test_only_samples_above_the_minimums_move_the_prompt_speed(
    policy: DeadlinePolicy, first: tuple[int, float], second: tuple[int, float]
) -> None:
    tracker = SpeedTracker(policy)
    expected = policy.prompt_tok_s
    seen = False
    for tokens, ms in (first, second):
        tracker.observe_prompt(tokens, ms)
        # A subnormal ms is 0 s, or a speed past any float: no speed to read, as no time.
        seconds = ms / 1000
        sample = tokens / seconds if seconds > 0 else math.inf
        if tokens >= 32 and ms > 0 and math.isfinite(sample):
            expected = 0.7 * expected + 0.3 * sample if seen else sample
            seen = True
        assert math.isclose(tracker.prompt_tok_s, expected, rel_tol=1e-9)
        assert tracker.measured_prompt_tok_s == (tracker.prompt_tok_s if seen else None)
    assert tracker.decode_tok_s == policy.decode_tok_s


@EXAMPLES
@given(
    policy=POLICIES,
    completion=st.integers(0, 10_000),
    predicted_ms=st.floats(min_value=0.0, max_value=1e7),
)
def test_only_a_decode_sample_of_8_tokens_and_some_time_moves_the_decode_speed(
    policy: DeadlinePolicy, completion: int, predicted_ms: float
) -> None:
    tracker = SpeedTracker(policy)
    tracker.observe(
        make_result(
            prompt_tokens=0,
            cached_tokens=0,
            completion_tokens=completion,
            prompt_ms=0.0,
            predicted_ms=predicted_ms,
        )
    )
    seconds = predicted_ms / 1000
    if completion >= 8 and seconds > 0 and math.isfinite(completion / seconds):
        assert math.isclose(tracker.decode_tok_s, completion / (predicted_ms / 1000))
    else:
        assert tracker.decode_tok_s == policy.decode_tok_s
    assert tracker.prompt_tok_s == policy.prompt_tok_s


# ---- regression: samples that say nothing about speed -----------------------------------------


def test_a_sample_whose_speed_is_no_number_leaves_the_speeds_as_they_were() -> None:
    # A duration so small that it is zero in seconds (5e-324 ms / 1000 underflows) raised
    # ZeroDivisionError, an infinite one set a speed of 0 and every later deadline raised it,
    # and a count past any float raised OverflowError: inside the engine's `_record`, after the
    # ledger kept the row, so the run ended.
    tracker = SpeedTracker(DeadlinePolicy())
    tracker.observe(
        make_result(
            prompt_tokens=1100,
            cached_tokens=100,
            completion_tokens=50,
            prompt_ms=5e-324,
            predicted_ms=5e-324,
        )
    )
    tracker.observe(make_result(completion_tokens=50, predicted_ms=math.inf))
    tracker.observe_prompt(1000, math.inf)
    tracker.observe_prompt(10**400, 1000.0)
    assert (tracker.prompt_tok_s, tracker.decode_tok_s) == (5.0, 1.0)
    assert tracker.measured_prompt_tok_s is None
    assert tracker.deadline_s(1000, 100) == 3 * (1000 / 5.0 + 100 / 1.0)  # the initial guesses
