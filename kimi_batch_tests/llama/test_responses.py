"""llama-server's answers read into `kimi_batch.llama.responses`: a count no server can mean (a
negative one, as a fork writing -1 for "unknown") is read as absent, in a chat answer's `usage`
and in `/completion`'s own counts alike, and what the answer says otherwise still gives the
cached and prompt tokens. Server-free: the bodies are built here."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kimi_batch.llama.responses import ChatCompletion, Completion

TIMINGS = {"prompt_n": 5, "prompt_ms": 10.0, "predicted_n": 3, "predicted_ms": 30.0}


def chat(**envelope: Any) -> ChatCompletion:
    choice = {"index": 0, "finish_reason": "stop", "message": {"content": "kept"}}
    return ChatCompletion.model_validate({"choices": [choice], **envelope})


def test_a_negative_usage_count_leaves_the_cached_count_to_n_past() -> None:
    # usage.prompt_tokens=-1 was read as a known total of 0: cached 0 - 5 became 0 and the
    # prompt 5, though n_past said 100 tokens were in the slot (92 cached, 97 in the prompt).
    usage = {"prompt_tokens": -1, "completion_tokens": -1, "total_tokens": -1}
    answer = chat(usage=usage, timings=TIMINGS, n_past=100)

    assert answer.usage is not None
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (None, None)
    assert answer.usage.total_tokens is None
    stats = answer.stats
    assert (stats.cached_tokens, stats.prompt_tokens) == (92, 97)
    assert (stats.evaluated_tokens, stats.completion_tokens) == (5, 3)


def test_usage_without_counts_is_read_as_absent_not_as_zero() -> None:
    answer = chat(usage={}, timings={**TIMINGS, "n_past": 100})

    assert answer.usage is not None
    assert answer.usage.prompt_tokens is None
    assert (answer.stats.cached_tokens, answer.stats.prompt_tokens) == (92, 97)


def test_a_known_usage_total_still_gives_the_cached_count() -> None:
    answer = chat(usage={"prompt_tokens": 40, "completion_tokens": 3}, timings=TIMINGS)

    assert (answer.stats.cached_tokens, answer.stats.prompt_tokens) == (35, 40)
    assert answer.stats.completion_tokens == 3


def test_a_negative_count_of_a_text_completion_is_read_as_absent() -> None:
    # `/completion` (LlamaClient.complete) read its own counts as given: tokens_predicted=-1
    # made `.stats` raise pydantic's ValidationError.
    body = {"content": "kept", "tokens_predicted": -1, "tokens_evaluated": -1, "tokens_cached": -1}
    completion = Completion.model_validate(body)

    assert (completion.tokens_predicted, completion.tokens_evaluated) == (0, None)
    assert completion.tokens_cached is None
    stats = completion.stats
    assert (stats.prompt_tokens, stats.cached_tokens, stats.completion_tokens) == (0, 0, 0)

    with_timings = Completion.model_validate({**body, "timings": TIMINGS, "tokens_cached": 100})
    assert (with_timings.stats.cached_tokens, with_timings.stats.prompt_tokens) == (92, 97)
    assert with_timings.stats.completion_tokens == 3


COUNT = st.one_of(st.integers(-3, 200), st.integers(-(1 << 70), 1 << 70))


@settings(max_examples=200, deadline=None)
@given(
    counts=st.fixed_dictionaries(
        {},
        optional={"tokens_predicted": COUNT, "tokens_evaluated": COUNT, "tokens_cached": COUNT},
    ),
    timings=st.none() | st.fixed_dictionaries({}, optional={"prompt_n": COUNT, "n_past": COUNT}),
)
def test_any_text_completion_counts_give_stats(
    counts: dict[str, int], timings: dict[str, int] | None
) -> None:
    completion = Completion.model_validate({"content": "kept", **counts, "timings": timings})
    stats = completion.stats  # never pydantic's ValidationError

    assert stats.prompt_tokens >= stats.cached_tokens >= 0
    assert stats.completion_tokens >= 0
    for name, value in counts.items():
        read = getattr(completion, name)
        assert read == value if value >= 0 else read in (None, 0)
