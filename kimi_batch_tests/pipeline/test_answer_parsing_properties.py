"""Properties of reading a stage's row out of the model's free text: amplify's variant, the judge's
verdict.

- A variant written the ways a model answers the amplify instruction (bare, quoted in any of the
  quotes, after a label such as "Paraphrase:" or "**Rewritten question:**", after a lead-in line,
  as the first item of a list, in a code fence with or without a language tag or on one line,
  after the echoed variant number, followed by an answer paragraph) parses back to the same text.
- A fence is stripped as `^```[\\w-]*\\s*|\\s*```$` strips it, but a language tag is a word alone
  on the opening line; a long run of whitespace anywhere is parsed in linear time.
- Any model text, with any finish reason, gives an `amplified` row or a set-aside with a reason,
  never an exception: every result of the sink is a row, a dropped duplicate or a quarantine row;
  a row's prompt is one stripped, storable paragraph of at least 8 characters with a letter.
- A verdict the judge writes (any JSON spelling of `{"score", "reason"}`: key order, spacing,
  escapes) is a `judged` row with that score and reason when `Verdict` accepts it, else a
  set-aside saying "not a verdict"; any text is one or the other, and a row is storable (a
  `\\ud800` escape in the JSON never reaches the table).
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kimi_batch.engine import GenerationResult
from kimi_batch.inputs.prompts import SeedPrompt
from kimi_batch.pipeline import (
    TEMPLATES,
    AmplifiedRow,
    AmplifyTask,
    JudgedRow,
    JudgeInputs,
    JudgeTask,
    QuarantineRow,
    SeedInputs,
    SetAside,
    StageSink,
    Strategy,
    Verdict,
    parse_variant,
    truncate_raw,
)
from kimi_batch.pipeline.amplify import _unfenced  # pyright: ignore[reportPrivateUsage]
from kimi_batch_tests.support.results import make_result
from kimi_batch_tests.support.rows import amplified, distilled

EXAMPLES = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_ODD = "日本語عربي😀👩‍👩‍👧é\u0301\x00\x01\x1b\x7f\x85\u2028\u200b\ufeff\t\r\n \"'`\\{}[]…*_#-:"
TEXT = st.text(st.one_of(st.characters(codec="utf-8"), st.sampled_from(_ODD)), max_size=60)
FINISH_REASONS = st.sampled_from(["stop", "length", "tool_calls", "error"])


def _valid_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _storable(value: Any) -> bool:
    """Whether the warehouse can hold every string of a row's dump (valid UTF-8)."""
    if isinstance(value, str):
        return _valid_utf8(value)
    if isinstance(value, dict):
        return all(_storable(item) for item in value.values())  # pyright: ignore[reportUnknownVariableType]
    if isinstance(value, list):
        return all(_storable(item) for item in value)  # pyright: ignore[reportUnknownVariableType]
    return True


# ---- amplify: the variant in the model's answer -------------------------------------------------

# The words a label is made of, and a lead-in's first words: a question that opens with
# "Question: ..." or "Sure, ...:" is ambiguous by nature, so a drawn variant holds none of them.
_LABEL_WORDS = {
    "question",
    "paraphrase",
    "variant",
    "version",
    "rewrite",
    "rephrasing",
    "prompt",
    "sure",
    "certainly",
    "okay",
    "ok",
    "of",
    "here",
}
WORDS = st.one_of(
    st.from_regex(r"[A-Za-z][a-z]{0,9}", fullmatch=True),
    st.sampled_from(["café", "naïve", "日本", "Ω", "x²", "2+2", "don't", "(a)", "e.g.", "3.5"]),
).filter(lambda word: word.lower() not in _LABEL_WORDS)
ENDINGS = st.sampled_from(["?", ".", "!", "\uff1f", "", "?)"])  # \uff1f: fullwidth "?"


@st.composite
def _variants(draw: st.DrawFn) -> str:
    """A plausible variant: a first word with a letter, then words and commas, an ending."""
    first = draw(
        st.from_regex(r"[A-Z][a-z]{2,9}", fullmatch=True).filter(
            lambda word: word.lower() not in _LABEL_WORDS
        )
    )
    rest = draw(st.lists(st.tuples(WORDS, st.sampled_from([" ", ", ", " - ", "; "])), max_size=8))
    body = first + "".join(sep + word for word, sep in rest)
    return body + draw(ENDINGS)


VARIANTS = _variants().filter(lambda variant: len(variant) >= 8)  # shorter is no prompt


_QUOTE_PAIRS = ['""', "''", "``", "\u201c\u201d", "\u2018\u2019", "\u00ab\u00bb", "\u201e\u201c"]
_LABELS = [
    "Paraphrase:",
    "Paraphrase: ",
    "**Rewritten question:** ",
    "Rewritten question: ",
    "New harder question: ",
    "New related question:\n",
    "Variant 2 of 3: ",
    "Variant 2 of 3 - ",
    "Question #1: ",
    "Harder version \u2014 ",
]
_LEAD_INS = [
    "Sure! Here is a harder version:\n\n",
    "Here's the rewritten question:\n",
    "Certainly. Here is the new question:\n\n",
    "Okay, here it is:\n",
]


@st.composite
def _rendered(draw: st.DrawFn, variant: str) -> str:
    """`variant` written as a model answers: decorated zero or more ways, in a plausible order."""
    text = variant
    if draw(st.booleans()):
        opening, closing = draw(st.sampled_from(_QUOTE_PAIRS))
        text = f"{opening}{text}{closing}"
    if draw(st.booleans()):
        text = f"**{text}**"
    if draw(st.booleans()):
        text = draw(st.sampled_from(_LABELS)) + text
    # A list item is its first line ("1. Question:\n..." is an empty item: set aside).
    if "\n" not in text and draw(st.booleans()):
        text = draw(st.sampled_from(["1. ", "1) ", "- ", "* ", "• "])) + text
        if draw(st.booleans()):
            text += "\n2. Why is grass green?"
    if draw(st.booleans()):
        text = "This is variant 2 of 3. " + text
    lead_in = draw(st.sampled_from([None, "inside", "outside"]))  # of the fence, if any
    if lead_in == "inside":
        text = draw(st.sampled_from(_LEAD_INS)) + text
    fence = draw(st.sampled_from([None, "", "text", "markdown", "one line"]))
    if fence == "one line":  # "```What is it?```": no line, so no language tag
        text = f"```{text}```"
    elif fence is not None:
        text = f"```{fence}\n{text}\n```"
    if lead_in == "outside":
        text = draw(st.sampled_from(_LEAD_INS)) + text
    if draw(st.booleans()):
        text += "\n\nAnswer: because light scatters."
    return (
        draw(st.sampled_from(["", " ", "\n", "\n\n"]))
        + text
        + draw(st.sampled_from(["", " ", "\n"]))
    )


def _result(text: str, *, finish_reason: str = "stop", **fields: Any) -> GenerationResult:
    return make_result(text, finish_reason=finish_reason, **fields)


@EXAMPLES
@given(data=st.data(), variant=VARIANTS)
def test_a_variant_written_as_models_answer_parses_back(data: st.DataObject, variant: str) -> None:
    text = data.draw(_rendered(variant))
    assert parse_variant(_result(text)) == variant
    # Cut off at max_tokens: still the variant when another paragraph followed it.
    if re.search(r"\n\s*\n\s*Answer:", text):
        assert parse_variant(_result(text, finish_reason="length")) == variant


@pytest.mark.parametrize(
    "text",
    [
        "```\nWhat makes the sky look blue?\n```\n\nAnswer: light scatters.",
        "Sure! Here is a harder version:\n\n```\nWhat makes the sky look blue?\n```",
        "Here's the rewritten question:\n```text\nWhat makes the sky look blue?\n```",
    ],
)
def test_a_fenced_variant_after_a_lead_in_or_before_more_text_loses_its_fence(text: str) -> None:
    # The fence was stripped only where it opened and closed the whole answer: these kept
    # "```" (and its language) in the prompt, then asked the teacher with it.
    assert parse_variant(_result(text)) == "What makes the sky look blue?"


def test_a_one_line_fence_keeps_the_first_word_of_its_variant() -> None:
    # The fence's language tag was read as [\w-]* after "```" with no line break after it, so
    # "```What makes ...```" lost "What" as if it were a language such as "```text".
    assert parse_variant(_result("```What makes the sky look blue?```")) == (
        "What makes the sky look blue?"
    )
    assert parse_variant(_result("```Rewrite-me why the sky is blue?```")) == (
        "Rewrite-me why the sky is blue?"
    )
    # With a line break after it, the word is the language and goes.
    assert parse_variant(_result("```text\nWhat makes the sky look blue?```")) == (
        "What makes the sky look blue?"
    )


# What `_unfenced` replaced, its language tag read only where a line break follows it: right on
# short text, quadratic on a run of whitespace.
_BREAKS = "\n\r\v\f\x1c-\x1e\x85\u2028\u2029"
_FENCE_PATTERN = re.compile(rf"^```(?:[\w-]*(?=[^\S{_BREAKS}]*[{_BREAKS}]))?\s*|\s*```$")
FENCE_TEXT = st.lists(
    st.sampled_from(
        ["```", "`", "text", "c-sharp", "What", "x", " ", "\t", "\n", "\r\n", "\u2028", "\x1f"]
    ),
    max_size=8,
).map("".join)


@EXAMPLES
@given(text=st.one_of(FENCE_TEXT, TEXT, st.tuples(FENCE_TEXT, TEXT, FENCE_TEXT).map("".join)))
def test_a_fence_is_stripped_as_the_fence_pattern_reads_it(text: str) -> None:
    assert _unfenced(text) == _FENCE_PATTERN.sub("", text.strip()).strip()


_LONG = 200_000


@pytest.mark.parametrize(
    ("text", "variant"),
    [
        ("a" + " " * _LONG + "b", "a" + " " * _LONG + "b"),
        ("What is" + "\t" * _LONG + "the sky?", "What is" + "\t" * _LONG + "the sky?"),
        ("```\nWhat is the sky?" + " " * _LONG + "\n\nAnswer: light.\n```", "What is the sky?"),
        ("Why is it?\n" + " " * _LONG + "\n\nAnswer: light.", "Why is it?"),
        ("Question" + " " * _LONG + ": What is the sky?", "What is the sky?"),
        ("Question 1 of" + " " * _LONG + "2 - What is the sky?", "What is the sky?"),
        ("a b c d" + " " * _LONG + "question: What is the sky?", "What is the sky?"),
        ("Sure:" + " " * _LONG + "x\nWhat is it?", "Sure:" + " " * _LONG + "x\nWhat is it?"),
    ],
    ids=["spaces", "tabs", "fenced", "blank-line", "label", "numbered", "words", "lead-in"],
)
def test_a_long_run_of_whitespace_is_parsed_in_linear_time(text: str, variant: str) -> None:
    # ^```[\w-]*\s*|\s*```$ tried \s*```$ at every position of a run of whitespace, so each
    # of these took 35 to 80 s of CPU (twice: on the whole text and on each paragraph) on the
    # thread that lands the partition. Not a tight bound: the quadratic parse is far above it.
    # The label, list mark and lead-in patterns are here too: they stay linear.
    started = time.process_time()
    parsed = parse_variant(_result(text))
    assert time.process_time() - started < 5
    assert parsed == variant


SEEDS = [
    SeedPrompt.model_validate(
        {
            "input_id": f"s{n}",
            "messages": [{"role": "user", "content": prompt}],
            "prompt": prompt,
            "source_file": "seeds.jsonl",
            "line": n,
        }
    )
    for n, prompt in enumerate(["Why is the sky blue?", "What is a prime number?"], start=1)
]
# Text near what the parser looks for: labels, lead-ins, list marks, fences, quotes, the
# instructions themselves, blank lines.
_PIECES = st.sampled_from(
    [
        *_LABELS,
        *_LEAD_INS,
        *(pair[0] for pair in _QUOTE_PAIRS),
        "1. ",
        "- ",
        "```",
        "**",
        "\n\n",
        "\n",
        " ",
        "This is variant 1 of 2.",
        "Why is the sky blue?",
        *TEMPLATES.values(),
    ]
)
MODEL_TEXT = st.one_of(TEXT, st.lists(st.one_of(_PIECES, TEXT), max_size=8).map("".join))


@st.composite
def _amplify_results(draw: st.DrawFn) -> list[GenerationResult]:
    count = draw(st.integers(0, 6))
    return [
        _result(
            draw(MODEL_TEXT),
            finish_reason=draw(FINISH_REASONS),
            request_id=f"a{index}",
            input_id=draw(st.sampled_from([seed.input_id for seed in SEEDS])),
            tag=draw(st.sampled_from(list(Strategy))).value,
        )
        for index in range(count)
    ]


@EXAMPLES
@given(results=_amplify_results())
def test_any_model_text_is_a_variant_row_or_a_set_aside_with_a_reason(
    results: list[GenerationResult],
) -> None:
    task = AmplifyTask()
    inputs = SeedInputs(seeds=SEEDS)
    for result in results:
        parsed = task.parse(result, inputs)
        if isinstance(parsed, SetAside):
            assert parsed.reason
            assert parsed.reason == "empty output" or parse_variant(result) is None
            continue
        assert isinstance(parsed, AmplifiedRow)
        assert parsed.prompt == parse_variant(result)
        _check_variant(parsed, result)

    sink = StageSink(task, inputs)
    rows = list(sink.rows(results))
    quarantined = sink.quarantined
    # Every result once: a row, a duplicate dropped (counted), or a quarantine row.
    assert len(rows) + sink.dropped + len(quarantined) == len(results)
    assert {row.request_id for row in rows}.isdisjoint(row.request_id for row in quarantined)
    by_id = {result.request_id: result for result in results}
    for aside in quarantined:
        assert aside.request_id is not None
        result = by_id[aside.request_id]
        assert (aside.stage, aside.input_id, aside.raw) == (
            "amplify",
            result.input_id,
            truncate_raw(result.text),
        )
        assert aside.reason
        assert QuarantineRow.model_validate(aside.model_dump()) == aside


def _check_variant(row: AmplifiedRow, result: GenerationResult) -> None:
    prompt = row.prompt
    assert prompt == prompt.strip()
    assert len(prompt) >= 8
    assert any(ch.isalpha() for ch in prompt)
    assert not re.search(r"\n\s*\n", prompt)  # one paragraph of the answer
    assert (row.seed_id, row.strategy, row.request_id) == (
        result.input_id,
        result.tag,
        result.request_id,
    )
    assert AmplifiedRow.model_validate(row.model_dump()) == row
    assert _storable(row.model_dump())


# ---- judge: the verdict in the model's answer ---------------------------------------------------

JUDGE_INPUTS = JudgeInputs(answers=distilled(amplified(2)))
SCORES = st.one_of(st.integers(-2, 12), st.sampled_from([5.0, 5.5, "7", True, None, 1 << 70]))
REASONS = st.one_of(
    st.text(st.characters(codec="utf-8"), max_size=30),
    st.text(max_size=30),  # lone surrogates: JSON writes them as `\ud800` escapes
    st.text(st.characters(codec="utf-8"), min_size=495, max_size=505),
    st.sampled_from(["", "\x00", "Correct and clear.", "日本語 😀"]),
    st.integers(),
)


@st.composite
def _verdict_texts(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    """A JSON object as the judge may write it, and the object."""
    verdict: dict[str, Any] = {"score": draw(SCORES), "reason": draw(REASONS)}
    if draw(st.booleans()):
        verdict = {"reason": verdict["reason"], "score": verdict["score"]}
    if draw(st.integers(0, 5)) == 0:
        verdict["extra"] = 1
    if draw(st.integers(0, 5)) == 0:
        del verdict[draw(st.sampled_from(["score", "reason"]))]
    text = json.dumps(
        verdict,
        ensure_ascii=draw(st.booleans()),
        indent=draw(st.sampled_from([None, 0, 2])),
        separators=draw(st.sampled_from([None, (",", ":")])),
    )
    return draw(st.sampled_from(["", " ", "\n"])) + text + draw(
        st.sampled_from(["", "\n"])
    ), verdict


def _judge(text: str, finish_reason: str = "stop") -> JudgedRow | SetAside:
    answer = JUDGE_INPUTS.answers[0]
    result = make_result(
        text, request_id="j1", input_id=answer.request_id, tag="judge", finish_reason=finish_reason
    )
    return JudgeTask(rubric="Grade it.").parse(result, JUDGE_INPUTS)


def _accepted(verdict: dict[str, Any]) -> Verdict | None:
    try:
        return Verdict.model_validate_json(json.dumps(verdict))
    except ValueError:
        return None


@EXAMPLES
@given(written=_verdict_texts())
def test_a_written_verdict_is_a_judged_row_with_its_score_and_reason(
    written: tuple[str, dict[str, Any]],
) -> None:
    text, verdict = written
    parsed = _judge(text)
    accepted = _accepted(verdict)
    if accepted is None or not _valid_utf8(accepted.reason):
        assert isinstance(parsed, SetAside)
        assert parsed.reason.startswith("not a verdict: ")
        return
    assert isinstance(parsed, JudgedRow)
    assert (parsed.score, parsed.reason) == (accepted.score, accepted.reason)
    # As written (a score in quotes or with a zero fraction read as Verdict reads it).
    assert parsed.reason == verdict["reason"]
    assert parsed.answer_request_id == JUDGE_INPUTS.answers[0].request_id
    assert JudgedRow.model_validate(parsed.model_dump()) == parsed
    assert _storable(parsed.model_dump())


@EXAMPLES
@given(
    text=st.one_of(MODEL_TEXT, _verdict_texts().map(lambda written: written[0][:-3])),
    finish_reason=FINISH_REASONS,
)
def test_any_judge_text_is_a_verdict_or_a_set_aside_never_an_exception(
    text: str, finish_reason: str
) -> None:
    parsed = _judge(text, finish_reason)
    if isinstance(parsed, SetAside):
        assert parsed.reason.startswith("not a verdict: ")
        assert parsed.reason.endswith("(cut off at max_tokens)") == (finish_reason == "length")
        assert parsed.source_file == "distilled"
    else:
        assert 1 <= parsed.score <= 10
        assert parsed.reason
        assert _storable(parsed.model_dump())
