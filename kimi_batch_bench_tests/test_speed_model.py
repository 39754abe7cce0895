"""The target's speed model against the source document's measurements (Kimi-K2.5 Q4, 16-core
EPYC 9175F, CPU only): the curves the stand-in runs on and `plan` predicts with."""

from __future__ import annotations

import pytest

from kimi_batch_bench import plan, standin_slots
from kimi_batch_bench.speed_model import TargetProfile

PROFILE = TargetProfile()


@pytest.mark.parametrize(
    ("prompt", "generated", "measured_tok_s"),
    [
        (823, 438, 10.27),  # Q4_K_S, ctx 16k, first request
        (1335, 1012, 8.76),  # second request, the first one's context kept
        (16148, 333, 2.44),  # Q4_K_M "ctx=32k: 2.4 tok/s": a 32k server holding 16.5k tokens
        (16481 + 356, 2048, 2.26),  # the next request on that context
    ],
)
def test_single_slot_decode_slows_as_the_context_grows(
    prompt: int, generated: int, measured_tok_s: float
) -> None:
    tok_s = generated / PROFILE.decode_cost(prompt, generated)

    assert tok_s == pytest.approx(measured_tok_s, rel=0.06)


def test_decode_cost_is_the_sum_of_its_steps() -> None:
    steps = sum(PROFILE.decode_step_cost([5000 + k] * 3) for k in range(200))

    assert PROFILE.decode_cost(5000, 200, slots=3) == pytest.approx(steps)
    # At a full 32k context one stream decodes at about 1.3 tok/s: 32k is the ceiling, not 2.4.
    assert 1 / PROFILE.decode_step_cost([32768]) == pytest.approx(1.28, rel=0.02)


def test_slots_share_the_weight_passes_and_a_round_waits_for_every_prompt() -> None:
    one = PROFILE.decode_step_cost([2000])
    four = PROFILE.decode_step_cost([2000] * 4)

    assert one < four < 4 * one  # more tokens a step in all, each slot slower
    assert PROFILE.round_s(2000, 100, 50, 4) == pytest.approx(
        4 * PROFILE.prefill_cost(2000, 100) + PROFILE.decode_cost(2100, 50, 4)
    )
    assert 16148 / PROFILE.prefill_cost(0, 16148) == pytest.approx(6.15, rel=0.02)  # 44 min


def test_the_stand_in_and_plan_use_this_one_model() -> None:
    assert standin_slots.TargetProfile is TargetProfile
    assert plan.TargetProfile is TargetProfile
