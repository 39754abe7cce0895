"""Request identity and ranks, planned without a server: which requests share one answer (only
determined ones), which are each their own sample, and the rank a shared request goes out at."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from kimi_batch.engine.batch_engine import BatchEngine
from kimi_batch.engine.digest import SystemDigest
from kimi_batch.engine.generation import GenerationRequest, SamplingParams, request_key
from kimi_batch.engine.ledger import Ledger
from kimi_batch.engine.outcome import Endpoint, PlannedRequest, distinct
from kimi_batch.engine.schedule import PrefixSchedule
from kimi_batch.llama.messages import ChatMessage

SAMPLED = SamplingParams(max_tokens=8, temperature=1.0, top_p=1.0)
GREEDY = SamplingParams(max_tokens=8, temperature=0.0)
SEEDED = SamplingParams(max_tokens=8, temperature=1.0, seed=42)
DIGEST = SystemDigest.from_text("You answer briefly.\n")


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[BatchEngine]:
    endpoint = Endpoint(base_url="http://127.0.0.1:9", slots=1, model="m")
    with Ledger(tmp_path / "ledger.sqlite3") as ledger:
        yield BatchEngine([endpoint], DIGEST, ledger, digest_tokens=10)


def _same_line(
    n: int, params: SamplingParams, *, scope: str = "batch_a", priority: int = 0
) -> list[GenerationRequest]:
    """`n` identical requests of `n` input rows (custom ids `line0..`)."""
    message = [ChatMessage(role="user", content="Write one word.")]
    return [
        GenerationRequest(
            input_id=f"line{i}",
            messages=message,
            params=params,
            sample_scope=scope,
            priority=priority,
        )
        for i in range(n)
    ]


def _keys(engine: BatchEngine, requests: list[GenerationRequest]) -> list[str]:
    return [p.content_key for p in distinct(engine.plan(requests))]


def test_identical_lines_that_sample_are_each_their_own(engine: BatchEngine) -> None:
    assert len(set(_keys(engine, _same_line(3, SAMPLED)))) == 3


def test_identical_greedy_or_seeded_lines_share_one_answer(engine: BatchEngine) -> None:
    assert len(_keys(engine, _same_line(3, GREEDY))) == 1
    assert len(_keys(engine, _same_line(3, SEEDED))) == 1
    # Determined: the same in another batch or partition, too.
    assert _keys(engine, _same_line(1, GREEDY)) == _keys(
        engine, _same_line(1, GREEDY, scope="batch_b")
    )


def test_a_random_seed_value_samples(engine: BatchEngine) -> None:
    # -1 and 0xFFFFFFFF are llama.cpp's "pick a random seed".
    for seed in (-1, 0xFFFFFFFF):
        params = SAMPLED.model_copy(update={"seed": seed})
        assert not params.determined
        assert len(set(_keys(engine, _same_line(2, params)))) == 2


def test_a_rerun_of_the_scope_has_the_same_keys_another_scope_new_ones(
    engine: BatchEngine,
) -> None:
    first = _keys(engine, _same_line(3, SAMPLED))
    assert _keys(engine, _same_line(3, SAMPLED)) == first  # a rerun finds its rows
    second = _keys(engine, _same_line(3, SAMPLED, scope="batch_b"))
    assert not set(first) & set(second)  # another batch samples anew


def test_a_determined_request_keeps_the_key_it_had() -> None:
    """Ledgers written before sample identity stay valid for greedy and seeded requests."""
    messages = [ChatMessage(role="user", content="Write one word.")]
    before = json.dumps(
        {
            "digest": DIGEST.sha256,
            "model": "m",
            # The params as they were dumped before the optional sampling fields existed.
            "params": {
                "max_tokens": 8,
                "temperature": 0.0,
                "top_p": 0.95,
                "seed": None,
                "n_probs": 0,
                "json_schema": None,
            },
            "messages": [m.model_dump(mode="json") for m in messages],
        },
        sort_keys=True,
        ensure_ascii=False,
        separators=(",", ":"),
    )
    request = _same_line(1, GREEDY)[0]
    key = request_key(
        digest_sha256=DIGEST.sha256,
        model="m",
        params=GREEDY,
        messages=messages,
        sample=request.sample,
    )
    assert key == hashlib.sha256(before.encode()).hexdigest()[:32]


def test_a_shared_request_takes_the_oldest_partition_s_rank(engine: BatchEngine) -> None:
    # A night of two partitions (rank 0 the oldest) that both ask one greedy question; the
    # newer one lists it first, as a night whose newer partition comes first in the batch would.
    newer = [*_same_line(1, GREEDY, priority=1), *_own_questions("new", 1)]
    older = [*_own_questions("old", 0), *_same_line(1, GREEDY, priority=0)]
    unique = distinct(engine.plan([*newer, *older]))
    shared = unique[0]
    assert len(unique) == 5
    assert shared.request.priority == 0

    schedule: PrefixSchedule[PlannedRequest] = PrefixSchedule(
        unique,
        text=lambda p: p.request.messages[0].content,
        work=lambda _: 1,
        rank=lambda p: p.request.priority,
    )
    lane = schedule.lane()
    order = [item.request.priority for item in iter(lane.next, None)]
    # Everything the oldest partition needs (the shared request too) goes out before the rest.
    assert order == [0, 0, 0, 1, 1]


def _own_questions(prefix: str, priority: int) -> list[GenerationRequest]:
    return [
        GenerationRequest(
            input_id=f"{prefix}{i}",
            messages=[ChatMessage(role="user", content=f"{prefix} question {i}?")],
            params=GREEDY,
            priority=priority,
        )
        for i in range(2)
    ]


def test_requests_differing_only_in_a_sampling_field_never_share_a_ledger_row() -> None:
    """`stop`, the penalties and `logit_bias` change the answer: each is part of the key; a
    request setting none keeps the key it had before they existed."""
    message = [ChatMessage(role="user", content="Count to ten.")]

    def key(params: SamplingParams) -> str:
        return request_key(digest_sha256="d", model="m", params=params, messages=message)

    variants = [
        GREEDY,
        GREEDY.model_copy(update={"stop": ["5"]}),
        GREEDY.model_copy(update={"stop": ["6"]}),
        GREEDY.model_copy(update={"presence_penalty": 1.0}),
        GREEDY.model_copy(update={"frequency_penalty": 1.0}),
        GREEDY.model_copy(update={"logit_bias": {"42": -100.0}}),
    ]
    assert len({key(params) for params in variants}) == len(variants)
    assert "stop" not in GREEDY.key_fields()


def test_a_chat_line_and_a_completion_line_of_the_same_text_never_share_an_answer(
    engine: BatchEngine,
) -> None:
    """A raw prompt is sent with no chat template and no digest: another request. A chat
    request keeps the key it had before kinds existed; tools are part of the key too."""
    chat, completion = (
        GenerationRequest(input_id=kind, messages=_same_line(1, GREEDY)[0].messages,
                          params=GREEDY, kind=kind)
        for kind in ("chat", "completion")
    )  # fmt: skip
    tools = [{"type": "function", "function": {"name": "f"}}]
    with_tools = chat.model_copy(
        update={"params": GREEDY.model_copy(update={"tools": tools, "tool_choice": "required"})}
    )
    keys = _keys(engine, [chat, completion, with_tools])
    assert len(set(keys)) == 3
    assert keys[0] == request_key(
        digest_sha256=DIGEST.sha256, model="m", params=GREEDY, messages=chat.messages
    )
    with pytest.raises(ValueError, match="raw prompt"):
        GenerationRequest(
            input_id="x",
            messages=[ChatMessage(role="user", content="a"), ChatMessage(role="user", content="b")],
            kind="completion",
        )
    for chat_only in ({"tools": tools}, {"json_schema": {"type": "object"}}):
        with pytest.raises(ValueError, match="chat endpoint"):
            completion.model_validate(
                {**completion.model_dump(), "params": GREEDY.model_copy(update=chat_only)}
            )
