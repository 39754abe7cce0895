"""Amplification requests, variant parsing, dedup and rows (hand-built results: no server)."""

from __future__ import annotations

import random

import pytest

from kimi_batch.engine.generation import GenerationResult, SamplingParams, request_key
from kimi_batch.engine.schedule import shared_prefix
from kimi_batch.inputs.prompts import SeedPrompt
from kimi_batch.llama.messages import ChatMessage
from kimi_batch.pipeline import (
    DEFAULT_AMPLIFY_PARAMS,
    TEMPLATES,
    AmplifiedRow,
    AmplifyTask,
    QuarantineRow,
    SeedInputs,
    StageSink,
    Strategy,
    amplification_requests,
    dedup_variants,
    generation_columns,
    parse_variant,
)
from kimi_batch.quality import normalize_text
from kimi_batch_tests.support.results import CREATED, make_result


def _seed(input_id: str, prompt: str, line: int = 1) -> SeedPrompt:
    return SeedPrompt.model_validate(
        {
            "input_id": input_id,
            "messages": [{"role": "user", "content": prompt}],
            "prompt": prompt,
            "source_file": "seeds.jsonl",
            "line": line,
        }
    )


def _result(
    text: str,
    *,
    input_id: str = "s1",
    tag: str = "paraphrase",
    request_id: str = "r1",
    finish_reason: str = "stop",
) -> GenerationResult:
    return make_result(
        text, input_id=input_id, tag=tag, request_id=request_id, finish_reason=finish_reason
    )


SEEDS = [_seed("s1", "Why is the sky blue?", 1), _seed("s2", "What is a prime number?", 2)]


def _amplified(
    results: list[GenerationResult],
) -> tuple[list[AmplifiedRow], list[QuarantineRow], int]:
    """(rows, set-asides, duplicates dropped) of `results` through the stage's sink, as the
    asset lands them."""
    sink = StageSink(AmplifyTask(), SeedInputs(seeds=SEEDS))
    rows = list(sink.rows(results))
    return rows, sink.quarantined, sink.dropped


def _key(params: SamplingParams, messages: list[ChatMessage]) -> str:
    return request_key(digest_sha256="d", model="m", params=params, messages=messages)


def test_requests_k_per_seed_per_strategy_with_distinct_keys() -> None:
    requests = amplification_requests(SEEDS, [Strategy.PARAPHRASE, Strategy.HARDER], k=3)

    assert len(requests) == 2 * 2 * 3
    assert [r.tag for r in requests[:6]] == ["paraphrase"] * 3 + ["harder"] * 3
    assert {r.input_id for r in requests} == {"s1", "s2"}
    keys = {_key(r.params, r.messages) for r in requests}
    assert len(keys) == len(requests)
    for request in requests:
        assert [m.role for m in request.messages] == ["user"]
        assert TEMPLATES[Strategy(request.tag)] in request.messages[0].content
        assert request.params.max_tokens == DEFAULT_AMPLIFY_PARAMS.max_tokens
    assert "Why is the sky blue?" in requests[0].messages[0].content
    assert "variant 2 of 3" in requests[1].messages[0].content


def test_requests_are_deterministic_across_reruns() -> None:
    first = amplification_requests(SEEDS, ["related"], k=2)  # config strings work too
    again = amplification_requests(SEEDS, [Strategy.RELATED], k=2)

    assert first == again
    assert first[0].params.seed != first[1].params.seed
    other_base = amplification_requests(
        SEEDS, [Strategy.RELATED], k=2, params=SamplingParams(seed=1)
    )
    assert other_base[0].params.seed != first[0].params.seed


def test_single_variant_has_no_numbering_and_strategies_are_deduplicated() -> None:
    requests = amplification_requests(SEEDS[:1], [Strategy.HARDER, Strategy.HARDER], k=1)

    assert len(requests) == 1
    assert "variant" not in requests[0].messages[0].content.lower()


def test_shared_text_comes_first_seed_then_strategy_then_variant() -> None:
    requests = amplification_requests(SEEDS[:1], [Strategy.PARAPHRASE, Strategy.HARDER], k=2)
    texts = [request.messages[0].content for request in requests]
    seed = SEEDS[0].prompt.strip()

    assert all(text.startswith(f"Question:\n{seed}\n\n") for text in texts)
    # Two variants of one strategy differ only in their tail, after the whole instruction.
    same_strategy = shared_prefix(texts[0], texts[1])
    assert texts[0][:same_strategy].endswith(TEMPLATES[Strategy.PARAPHRASE] + " This is variant ")
    # Two strategies of one seed still share the seed.
    assert shared_prefix(texts[1], texts[2]) >= len(f"Question:\n{seed}\n\n")


def test_requests_reject_bad_k() -> None:
    with pytest.raises(ValueError, match="k must be at least 1"):
        amplification_requests(SEEDS, [Strategy.PARAPHRASE], k=0)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("What makes the sky look blue?", "What makes the sky look blue?"),
        ("Paraphrase: What makes the sky look blue?", "What makes the sky look blue?"),
        ('"What makes the sky look blue?"', "What makes the sky look blue?"),
        (
            "**Rewritten question:** “Why does the sky appear blue?”",
            "Why does the sky appear blue?",
        ),
        (
            "Sure! Here is a harder version:\n\nWhy is the sky red at sunset?",
            "Why is the sky red at sunset?",
        ),
        ("Here's the new question:\nHow do clouds form?", "How do clouds form?"),
        (
            "New related question: How do clouds form?\n\nAnswer: water vapour condenses.",
            "How do clouds form?",
        ),
        ("1. How do rainbows form?\n2. Why is grass green?", "How do rainbows form?"),
        ("- How do rainbows form?", "How do rainbows form?"),
        ("Variant 2 of 3: How do rainbows form?", "How do rainbows form?"),
        (
            "Question-answering systems: how do they rank passages?",
            "Question-answering systems: how do they rank passages?",
        ),
        ("This is variant 2 of 3. How do rainbows form?", "How do rainbows form?"),
        ("```\nHow do rainbows form?\n```", "How do rainbows form?"),
        ("", None),
        ("   \n\n  ", None),
        ("Paraphrase:", None),
        ('""', None),
        ("Why?", None),
        (TEMPLATES[Strategy.PARAPHRASE], None),
    ],
)
def test_parse_variant(text: str, expected: str | None) -> None:
    assert parse_variant(_result(text)) == expected


def test_parse_variant_rejects_a_cut_off_variant() -> None:
    assert parse_variant(_result("Why does the sky", finish_reason="length")) is None
    # A complete first paragraph survives even if the model rambled on until max_tokens.
    rambling = _result(
        "Why does the sky look blue?\n\nThe answer is that light", finish_reason="length"
    )
    assert parse_variant(rambling) == "Why does the sky look blue?"


def test_normalize_text_folds_case_and_spacing_only() -> None:
    assert normalize_text("  Why is the SKY   blue?! ") == "why is the sky blue?!"
    assert normalize_text("“Straße”\n…") == "“strasse” …"
    # Operators and symbols carry meaning: these are different prompts.
    assert normalize_text("What is 2-2?") != normalize_text("What is 2+2?")
    assert normalize_text("Is 3 < 2?") != normalize_text("Is 3 > 2?")
    assert normalize_text("Explain C# templates") != normalize_text("Explain C++ templates")
    assert normalize_text("+-*/") != normalize_text("<>=!")
    assert normalize_text("x²") != normalize_text("x2")


def _row(seed_id: str, prompt: str, request_id: str) -> AmplifiedRow:
    result = _result(prompt, input_id=seed_id, request_id=request_id)
    return AmplifiedRow.model_validate(
        {
            **generation_columns(result),
            "seed_id": seed_id,
            "strategy": "paraphrase",
            "prompt": prompt,
        }
    )


def test_dedup_drops_seed_copies_and_repeats() -> None:
    rows = [
        _row("s1", "Why is the sky blue", "r1"),  # the seed, without its question mark
        _row("s1", "What makes the sky blue?", "r2"),
        _row("s1", "what makes  the sky BLUE", "r3"),  # repeat of r2
        _row("s2", "What is a prime number?", "r4"),  # equal to seed s2
        _row("s2", "Define a prime number.", "r5"),
    ]

    kept, dropped = dedup_variants(rows, {s.input_id: s.prompt for s in SEEDS})

    assert [row.request_id for row in kept] == ["r2", "r5"]
    assert dropped == 3


def test_the_sink_parses_quarantines_and_is_order_independent() -> None:
    results = [
        _result("Paraphrase: What makes the sky look blue?", request_id="a1"),
        _result("what makes the sky look blue", request_id="a2"),  # duplicate of a1
        _result("", request_id="a3"),  # unusable
        _result("Why is the sky blue?", request_id="a4"),  # same as the seed
        _result(
            "Why are prime numbers important in cryptography?",
            input_id="s2",
            tag="related",
            request_id="b1",
        ),
    ]
    shuffled = results[:]
    random.Random(4).shuffle(shuffled)

    rows, quarantined, duplicates = _amplified(results)

    assert (rows, quarantined, duplicates) == _amplified(shuffled)
    assert [(r.seed_id, r.strategy, r.prompt) for r in rows] == [
        ("s1", "paraphrase", "What makes the sky look blue?"),
        ("s2", "related", "Why are prime numbers important in cryptography?"),
    ]
    assert rows[0].request_id == "a1"
    assert rows[0].cached_tokens == 100
    assert rows[0].created_at == CREATED
    assert duplicates == 2
    (bad,) = quarantined
    assert (bad.stage, bad.request_id, bad.input_id, bad.reason) == (
        "amplify",
        "a3",
        "s1",
        "empty output",
    )
    assert (bad.source_file, bad.line, bad.finish_reason) == ("seeds.jsonl", 1, "stop")


def test_the_sink_rejects_results_the_stage_did_not_ask_for() -> None:
    with pytest.raises(ValueError, match="unknown seed"):
        _amplified([_result("How?", input_id="nope")])
    with pytest.raises(ValueError, match="no strategy tag"):
        _amplified([_result("How do tides work?", tag="seed")])
