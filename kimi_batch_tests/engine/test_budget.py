"""Answer budgets and the slot fit: nothing is sent with a budget the server cannot hold, and a
context too small for digest + prompt + answer is refused with the numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from kimi_batch.engine import (
    ContextTooSmallError,
    Endpoint,
    Prepared,
    SpeedStore,
    SpeedTracker,
    answer_cap,
    check_fit,
)
from kimi_batch.engine.batch_engine import BatchEngine
from kimi_batch.engine.deadline import DeadlinePolicy
from kimi_batch.engine.digest import SystemDigest
from kimi_batch.engine.generation import GenerationRequest, SamplingParams
from kimi_batch.engine.ledger import Ledger
from kimi_batch.llama.messages import ChatMessage
from kimi_batch_tests.support.results import make_result

# The Batch API's "no max_tokens given": as long as the server allows.
UNSET_MAX_TOKENS = 1 << 20


def test_the_default_context_refuses_the_targets_digest_with_the_numbers() -> None:
    # The source documents' digest (16,148 tokens) in the default 16,384 over 4 slots.
    with pytest.raises(ContextTooSmallError) as raised:
        check_fit(digest_tokens=16_148, prompt_tokens=512, answer_tokens=1024, ctx=16_384, slots=4)
    message = str(raised.value)
    assert "16,148 + prompt 512 + answer 1,024 = 17,684 tokens" in message
    assert "a slot holds 4,096 (context 16,384 over 4 slots)" in message
    assert "KIMI_BATCH_LLAMA_CTX to at least 71680" in message  # 4 x 17,684, rounded up to 1,024
    assert "\n" not in message


def test_a_context_set_as_advised_fits() -> None:
    fit = check_fit(
        digest_tokens=16_148, prompt_tokens=512, answer_tokens=1024, ctx=71_680, slots=4
    )
    assert fit.fits
    assert fit.slot_ctx == 17_920


def test_the_answer_cap_is_the_servers_n_predict_and_the_slot_after_the_digest() -> None:
    assert answer_cap(n_predict=256, slot_ctx=4096, digest_tokens=1000) == 256
    assert answer_cap(n_predict=-1, slot_ctx=4096, digest_tokens=1000) == 3096
    assert answer_cap(n_predict=8000, slot_ctx=4096, digest_tokens=1000) == 3096
    assert answer_cap(n_predict=-1, slot_ctx=None, digest_tokens=1000) is None


def _api_request() -> GenerationRequest:
    return GenerationRequest(
        input_id="line-1",
        messages=[ChatMessage(role="user", content="Say hello.")],
        params=SamplingParams(max_tokens=UNSET_MAX_TOKENS),
    )


def test_a_server_reporting_no_n_predict_gets_no_budget_beyond_its_slot(tmp_path: Path) -> None:
    # An attached server whose /props says n_predict -1: the budget stops where the slot does.
    endpoint = Endpoint(base_url="http://127.0.0.1:9", slots=4, model="m", ctx=4096, n_predict=-1)
    digest = SystemDigest.from_text("You are a teacher.\n")
    with Ledger(tmp_path / "ledger.sqlite3") as ledger:
        engine = BatchEngine([endpoint], digest, ledger, digest_tokens=1000)
        (planned,) = engine.plan([_api_request()])
    assert planned.params.max_tokens == 4096 - 1000


def test_a_raw_prompt_completion_is_budgeted_and_keyed_with_no_digest(tmp_path: Path) -> None:
    # A completion is sent alone: the engine's digest is not in its slot, its budget or its key.
    endpoint = Endpoint(base_url="http://127.0.0.1:9", slots=4, model="m", ctx=4096, n_predict=-1)
    digest = SystemDigest.from_text("You are a teacher.\n")
    raw = GenerationRequest(
        input_id="raw",
        messages=[ChatMessage(role="user", content="Once upon a time")],
        params=SamplingParams(max_tokens=UNSET_MAX_TOKENS),
        kind="completion",
    )
    with Ledger(tmp_path / "ledger.sqlite3") as ledger:
        engine = BatchEngine([endpoint], digest, ledger, digest_tokens=1000)
        (chat, completion) = engine.plan([_api_request(), raw])
        empty = SystemDigest.from_text("")
        (api_line,) = engine.plan([raw.model_copy(update={"digest": empty})])
    assert (chat.params.max_tokens, completion.params.max_tokens) == (4096 - 1000, 4096)
    assert engine.digest_of(raw).sha256 == empty.sha256
    assert completion.content_key == api_line.content_key  # a Batch API line keys alike


def test_prepared_endpoints_refuse_what_their_slots_cannot_hold() -> None:
    prepared = Prepared(
        endpoints=[Endpoint(base_url="http://x", slots=2, model="m", ctx=2048)],
        digest_tokens=1800,
    )
    with pytest.raises(ContextTooSmallError, match=r"1,800 \+ prompt 256 \+ answer 256"):
        prepared.check_fit(
            prompt_tokens=256, answer_tokens=256, remedy="start it with -c {ctx_needed}"
        )
    assert prepared.check_fit(prompt_tokens=100, answer_tokens=100)[0].needed == 2000


def test_measured_speeds_carry_over_to_the_next_tracker(tmp_path: Path) -> None:
    store = SpeedStore(tmp_path / "server" / "speeds.json")
    first = SpeedTracker(DeadlinePolicy(), store=store, model="m")
    assert first.measured_prompt_tok_s is None
    first.observe(
        make_result(prompt_tokens=1100, cached_tokens=100, prompt_ms=2000.0, predicted_ms=1000.0)
    )
    first.observe_prompt(4000, 10_000.0)  # a digest prefill
    first.keep()

    again = SpeedTracker(DeadlinePolicy(), store=store, model="m")
    assert again.measured_prompt_tok_s == pytest.approx(first.prompt_tok_s)
    assert again.decode_tok_s == pytest.approx(first.decode_tok_s)
    other = SpeedTracker(DeadlinePolicy(), store=store, model="another")
    assert other.measured_prompt_tok_s is None


def test_an_unreadable_speeds_file_is_a_cold_start(tmp_path: Path) -> None:
    path = tmp_path / "speeds.json"
    path.write_text("{not json")
    tracker = SpeedTracker(DeadlinePolicy(), store=SpeedStore(path), model="m")
    assert tracker.measured_prompt_tok_s is None
