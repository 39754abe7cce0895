"""Properties of what a slot can hold (`kimi_batch.engine.budget`).

- Answer cap: for any server n_predict (positive, 0 or -1: none), slot context (known or not)
  and digest size, the cap is None exactly when neither n_predict nor the slot's context is
  known; otherwise it is at least 1 (the documented minimum, so a digest that fills the slot
  still gets an answer token), never above n_predict when the server has one, never above what
  the slot has left after the digest unless that is under the minimum, and equal to one of
  them.
- Fit: `check_fit` raises `ContextTooSmallError` exactly when digest + prompt + answer exceeds
  the context divided by the slots (llama.cpp's split), and its error names a `ctx_needed`
  that is a multiple of 1,024 which holds the sum in each slot, 1,024 less no longer.
- Estimate: `estimate_tokens` is the characters over 4, rounded up.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kimi_batch.engine.budget import (
    ContextTooSmallError,
    SlotFit,
    answer_cap,
    check_fit,
    estimate_tokens,
)

EXAMPLES = settings(max_examples=300, deadline=None)
TOKENS = st.one_of(st.integers(0, 5000), st.integers(0, 1 << 40))


@EXAMPLES
@given(
    n_predict=st.one_of(st.sampled_from([-1, 0]), st.integers(-(1 << 20), 1 << 40)),
    slot_ctx=st.one_of(st.none(), st.just(0), st.integers(1, 1 << 40)),
    digest_tokens=TOKENS,
)
def test_the_answer_cap_is_at_least_one_and_within_n_predict_and_the_slot(
    n_predict: int, slot_ctx: int | None, digest_tokens: int
) -> None:
    cap = answer_cap(n_predict=n_predict, slot_ctx=slot_ctx, digest_tokens=digest_tokens)
    limits = [n_predict] if n_predict > 0 else []
    if slot_ctx:
        limits.append(max(1, slot_ctx - digest_tokens))
    if not limits:
        assert cap is None
        return
    assert cap is not None
    assert cap >= 1
    assert cap in limits
    assert cap == min(limits)
    if n_predict > 0:
        assert cap <= n_predict
    if slot_ctx and slot_ctx - digest_tokens >= 1:
        assert cap <= slot_ctx - digest_tokens


@EXAMPLES
@given(
    digest=TOKENS,
    prompt=TOKENS,
    answer=TOKENS,
    ctx=st.one_of(st.integers(1, 1 << 16), st.integers(1, 1 << 42)),
    slots=st.integers(1, 64),
    estimated=st.booleans(),
)
def test_the_fit_fails_exactly_when_the_sum_exceeds_one_slot(
    digest: int, prompt: int, answer: int, ctx: int, slots: int, estimated: bool
) -> None:
    needed = digest + prompt + answer
    arguments = {
        "digest_tokens": digest,
        "prompt_tokens": prompt,
        "answer_tokens": answer,
        "ctx": ctx,
        "slots": slots,
        "digest_estimated": estimated,
    }
    if needed <= ctx // slots:
        fit = check_fit(**arguments)
        assert fit.fits
        assert fit.needed == needed
        return
    with pytest.raises(ContextTooSmallError) as refused:
        check_fit(**arguments)
    found = re.search(r"KIMI_BATCH_LLAMA_CTX to at least (\d+)", str(refused.value))
    assert found is not None
    ctx_needed = int(found[1])
    assert ctx_needed % 1024 == 0
    assert SlotFit(**{**arguments, "ctx": ctx_needed}).fits
    if ctx_needed > 1024:
        assert not SlotFit(**{**arguments, "ctx": ctx_needed - 1024}).fits
    assert f"{needed:,}" in str(refused.value)  # the user sees the numbers


@EXAMPLES
@given(text=st.text(max_size=200))
def test_a_token_estimate_is_the_characters_over_four_rounded_up(text: str) -> None:
    tokens = estimate_tokens(text)
    assert 4 * tokens >= len(text) > 4 * (tokens - 1)
