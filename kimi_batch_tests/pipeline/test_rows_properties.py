"""Properties of how a stage turns its inputs and results into rows (`kimi_batch.pipeline.rows`,
the distill stage's requests, tags and parse, and `StageSink`).

- `truncate_raw` keeps text that fits as it is, and cuts longer text to exactly `limit`
  characters (code points), its prefix kept and the cut marked with an ellipsis; a cut of valid
  Unicode is valid UTF-8. A limit under one character is refused.
- `raw_json` writes any record (unicode, lone surrogates, NaN and infinite floats, integers past
  64 bits, nesting, values JSON has no type for) as JSON that reads back to the same value, as
  written (`ensure_ascii=False`) where that is valid UTF-8, escaped where not. `rejected_raw`
  keeps a row's text as written and otherwise never raises: its JSON, or the fallback.
- `input_row`, `result_row` and `failure_rows` carry their ids, figures and reason over, with a
  non-empty reason and a `raw` of at most `RAW_LIMIT` characters, and every row they build
  validates again against `QuarantineRow`.
- Tags: every `RequestTag` round-trips through its wire form and a wire string parses only back
  to the tag that writes it; `parse_tag(variant_tag(s))` is the variant of `s`; any other string
  is a ValueError. Distillation requests are the same on every call, one per seed and variant.
- The distill stage's sink: every result lands exactly once, as a `distilled` row or as a
  quarantine row, never both and never lost; a row carries its result's ids, figures, answer,
  reasoning and tool calls (`_calls_json` reads back to the same calls), validates against
  `DistilledRow` and is storable (valid UTF-8, 64-bit integers) when its inputs are; a set-aside
  says why (empty, cut off, not the schema) and keeps the answer's text in `raw`. A failed
  request is one quarantine row. A schema's answer is stored only as JSON the schema reads back
  (1e999 or NaN, which read as infinity or NaN and write as null, is set aside).
- A Markdown fence around a JSON answer is unwrapped as `^```(?:json)?\\s*(.*?)\\s*```$` reads
  it, without that pattern's cubic backtracking on a fence that never closes.
"""

from __future__ import annotations

import json
import math
import re
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, PrivateAttr

from kimi_batch.engine import FailedRequest, GenerationResult
from kimi_batch.inputs.prompts import SeedPrompt
from kimi_batch.llama import ToolCall
from kimi_batch.pipeline import (
    EMPTY_REASON,
    RAW_LIMIT,
    TRUNCATED_REASON,
    AmplifiedRow,
    DistilledRow,
    DistillInputs,
    DistillTask,
    QuarantineRow,
    RequestTag,
    SetAside,
    StageSink,
    Strategy,
    distillation_requests,
    failure_rows,
    generation_columns,
    input_row,
    parse_tag,
    raw_json,
    rejected_raw,
    result_row,
    truncate_raw,
    variant_tag,
)
from kimi_batch.pipeline.distill import _unfenced  # pyright: ignore[reportPrivateUsage]
from kimi_batch_tests.support.results import make_result

EXAMPLES = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FEW = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ---- text ---------------------------------------------------------------------------------------

# Scripts, combining marks, emoji (ZWJ sequences), NUL and other controls, JSON syntax, the
# ellipsis itself.
_ODD = "日本語عربي😀👩‍👩‍👧é\u0301\x00\x01\x1b\x7f\x85\u2028\u200b\ufeff\t\r\n \"'\\{}[]…"
TEXT = st.text(st.one_of(st.characters(codec="utf-8"), st.sampled_from(_ODD)), max_size=30)
LONG = st.tuples(TEXT.filter(bool), st.integers(50, 1500)).map(lambda part: part[0] * part[1])
STRINGS = st.one_of(TEXT, LONG)
# What no valid text holds: a lone surrogate (a JSON `\ud800` escape decodes to one).
LONE = st.tuples(TEXT, st.characters(categories=["Cs"]), TEXT).map("".join)
ANY_TEXT = st.one_of(TEXT, LONG, LONE)


def _valid_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


_INT64 = (-(1 << 63), (1 << 63) - 1)


def _storable(value: Any) -> bool:
    """Whether the warehouse can hold `value` (a row's dump): UTF-8 text, 64-bit integers."""
    if isinstance(value, str):
        return _valid_utf8(value)
    if isinstance(value, bool):
        return True
    if isinstance(value, int):
        return _INT64[0] <= value <= _INT64[1]
    if isinstance(value, dict):
        return all(_storable(item) for item in value.values())  # pyright: ignore[reportUnknownVariableType]
    if isinstance(value, list):
        return all(_storable(item) for item in value)  # pyright: ignore[reportUnknownVariableType]
    return True


# ---- 1. truncate_raw ----------------------------------------------------------------------------


@EXAMPLES
@given(text=ANY_TEXT, limit=st.integers(1, 3000))
def test_truncate_raw_keeps_what_fits_and_cuts_the_rest_to_the_limit(text: str, limit: int) -> None:
    cut = truncate_raw(text, limit)
    assert len(cut) <= limit
    if len(text) <= limit:
        assert cut == text
    else:
        # Exactly `limit` characters: the text's own prefix, then the mark of the cut.
        assert cut == text[: limit - 1] + "…"
        assert len(cut) == limit
    if _valid_utf8(text):
        assert _valid_utf8(cut)


@given(text=STRINGS.filter(bool), limit=st.integers(-5, 0))
@EXAMPLES
def test_truncate_raw_refuses_a_limit_under_one_character(text: str, limit: int) -> None:
    with pytest.raises(ValueError, match="limit"):
        truncate_raw(text, limit)


def test_truncate_raw_with_a_limit_of_zero_does_not_return_the_text() -> None:
    # It returned `text[:-1] + "…"`: as long as the text, for a limit of 0.
    with pytest.raises(ValueError, match="at least 1"):
        truncate_raw("a long text", 0)


# ---- 2. raw_json and rejected_raw ---------------------------------------------------------------

FLOATS = st.one_of(st.floats(), st.sampled_from([math.nan, math.inf, -math.inf, -0.0]))
JSON_LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(-(1 << 80), 1 << 80), FLOATS, ANY_TEXT
)
JSON_VALUES = st.recursive(
    JSON_LEAVES,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(ANY_TEXT, inner, max_size=4)
    ),
    max_leaves=20,
)
# Values a Parquet or CSV record may hold that JSON has no type for: written with `str`.
NOT_JSON = st.one_of(
    st.datetimes(timezones=st.just(UTC)),
    st.binary(max_size=8),
    st.decimals(allow_nan=False, places=3),
    st.timedeltas(),
)
RECORDS = st.recursive(
    st.one_of(JSON_LEAVES, NOT_JSON),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(ANY_TEXT, inner, max_size=4)
    ),
    max_leaves=20,
)


def _has_lone_surrogate(value: Any) -> bool:
    return not _valid_utf8(json.dumps(value, ensure_ascii=False, default=str))


@EXAMPLES
@given(record=RECORDS)
def test_raw_json_is_json_of_the_record_in_valid_utf8(record: Any) -> None:
    text = raw_json(record)
    assert _valid_utf8(text)  # `raw` is written to Parquet
    # It reads back to the record's JSON (NaN and infinities as Python writes them: `NaN`).
    assert json.dumps(json.loads(text), default=str) == json.dumps(record, default=str)
    if not _has_lone_surrogate(record):
        # As written: non-ASCII text is not escaped where UTF-8 can hold it.
        assert text == json.dumps(record, ensure_ascii=False, default=str)


@EXAMPLES
@given(
    raw=st.one_of(st.none(), TEXT, JSON_VALUES),
    record=RECORDS,
)
def test_rejected_raw_is_the_text_as_written_else_the_value_as_json(raw: Any, record: Any) -> None:
    shown = rejected_raw(raw, record)
    if isinstance(raw, str):
        assert shown == raw
    else:
        assert shown == raw_json(record if raw is None else raw)


@pytest.mark.parametrize("depth", [10, 5_000, 100_000])
def test_rejected_raw_never_raises_on_nesting(depth: int) -> None:
    record: Any = []
    for _ in range(depth):
        record = [record]
    shown = rejected_raw(None, record)
    if depth == 10:
        assert shown == json.dumps(record)
    else:  # deeper than json.dumps recurses: the fallback, not a RecursionError
        assert shown.startswith("(not shown")


# ---- 3. quarantine rows: one builder for every stage ---------------------------------------------

NOW = datetime(2025, 6, 1, 3, 4, 5, tzinfo=UTC)
LINES = st.one_of(st.none(), st.integers(1, 1 << 40))


@EXAMPLES
@given(
    source_file=TEXT,
    line=LINES,
    reason=TEXT.filter(bool),
    raw=STRINGS,
    input_id=st.one_of(st.none(), TEXT),
)
def test_an_input_row_keeps_its_place_reason_and_a_cut_raw(
    source_file: str, line: int | None, reason: str, raw: str, input_id: str | None
) -> None:
    row = input_row(
        source_file=source_file, line=line, reason=reason, raw=raw, now=NOW, input_id=input_id
    )
    assert (row.stage, row.source_file, row.line, row.reason, row.input_id) == (
        "input",
        source_file,
        line,
        reason,
        input_id,
    )
    assert row.raw == truncate_raw(raw)
    assert len(row.raw) <= RAW_LIMIT
    assert row.created_at == NOW
    assert QuarantineRow.model_validate(row.model_dump()) == row
    assert _storable(row.model_dump())


_COUNTS = st.integers(0, _INT64[1])
_MS = st.floats(min_value=0, max_value=1e12, allow_nan=False)
TIMES = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
)


def _call(call_id: str, name: str, arguments: str) -> ToolCall:
    return ToolCall.model_validate(
        {"id": call_id, "function": {"name": name, "arguments": arguments}}
    )


CALLS = st.lists(st.builds(_call, TEXT, TEXT, STRINGS), max_size=3)
FINISH_REASONS = st.one_of(st.sampled_from(["stop", "length", "tool_calls", "error"]), TEXT)


@st.composite
def _result_fields(draw: st.DrawFn) -> dict[str, Any]:
    """A finished result's fields, as the ledger holds them (valid UTF-8, finite figures)."""
    return {
        "text": draw(st.one_of(STRINGS, st.sampled_from(["", " ", "\n\t ", "\x00"]))),
        "finish_reason": draw(FINISH_REASONS),
        "model": draw(TEXT),
        "digest_sha256": draw(TEXT),
        "prompt_tokens": draw(_COUNTS),
        "cached_tokens": draw(_COUNTS),
        "completion_tokens": draw(_COUNTS),
        "prompt_ms": draw(_MS),
        "predicted_ms": draw(_MS),
        "latency_ms": draw(_MS),
        "endpoint": draw(TEXT),
        "slot_id": draw(st.one_of(st.none(), st.integers(0, 64))),
        "created_at": draw(TIMES),
        "reasoning_content": draw(st.one_of(st.none(), STRINGS)),
        "draft_tokens": draw(st.one_of(st.none(), _COUNTS)),
        "draft_accepted_tokens": draw(st.one_of(st.none(), _COUNTS)),
        "tool_calls": draw(st.one_of(st.none(), CALLS)),
    }


@EXAMPLES
@given(
    fields=_result_fields(),
    request_id=TEXT,
    input_id=TEXT,
    stage=st.sampled_from(["amplify", "distill", "judge"]),
    line=LINES,
    reason=TEXT.filter(bool),
)
def test_a_result_set_aside_keeps_its_ids_figures_and_text(
    fields: dict[str, Any],
    request_id: str,
    input_id: str,
    stage: str,
    line: int | None,
    reason: str,
) -> None:
    result = make_result(request_id=request_id, input_id=input_id, **fields)
    row = result_row(result, stage=stage, source_file="in.jsonl", line=line, reason=reason)
    kept = ("request_id", "input_id", "model", "digest_sha256", "finish_reason", "created_at")
    kept += ("prompt_tokens", "cached_tokens", "completion_tokens")
    assert {name: getattr(row, name) for name in kept} == {
        name: getattr(result, name) for name in kept
    }
    assert (row.stage, row.source_file, row.line, row.reason) == (stage, "in.jsonl", line, reason)
    assert row.raw == truncate_raw(result.text)
    assert QuarantineRow.model_validate(row.model_dump()) == row
    assert _storable(row.model_dump())


FAILURES = st.lists(
    st.builds(
        FailedRequest,
        request_id=TEXT,
        input_id=TEXT,
        tag=TEXT,
        reason=TEXT,
        attempts=st.integers(0, 100),
    ),
    max_size=6,
)


@EXAMPLES
@given(failures=FAILURES, stage=st.sampled_from(["amplify", "distill", "judge"]))
def test_every_failed_request_is_one_quarantine_row_that_says_why(
    failures: list[FailedRequest], stage: str
) -> None:
    rows = failure_rows(
        failures,
        stage=stage,
        source_file="seeds",
        model="m",
        digest_sha="d" * 64,
        created_at=NOW,
    )
    assert [(r.request_id, r.input_id, r.raw) for r in rows] == [
        (f.request_id, f.input_id, f.tag) for f in failures
    ]
    for row, failure in zip(rows, failures, strict=True):
        assert row.reason.startswith(failure.reason)
        assert f"after {failure.attempts} attempts" in row.reason
        assert (row.stage, row.finish_reason, row.line, row.created_at) == (
            stage,
            "error",
            None,
            NOW,
        )
        assert QuarantineRow.model_validate(row.model_dump()) == row


# ---- 4. tags ------------------------------------------------------------------------------------

STAGE_NAMES = st.one_of(
    st.sampled_from(["amplify", "distill", "judge", "seed", "variant", "_", "a1"]),
    st.from_regex(r"[a-z_][a-z0-9_]{0,12}", fullmatch=True),
)
TAGS = st.builds(
    RequestTag,
    stage=STAGE_NAMES,
    origin=st.sampled_from(["seed", "variant"]),
    strategy=st.one_of(st.none(), st.sampled_from(list(Strategy))),
)
# Strings near the wire forms: separators, case, whitespace and strategy names mixed.
_WIRE_PARTS = st.sampled_from(
    ["seed", "variant", "variant:", ":", "/", "distill", "amplify", "judge", " ", "\n", "Seed"]
    + [strategy.value for strategy in Strategy]
)
# The generic form, "STAGE/ORIGIN" or "STAGE/ORIGIN:S", of every stage and origin.
_GENERIC = st.builds(
    "{}/{}{}".format,
    STAGE_NAMES,
    st.sampled_from(["seed", "variant", "other", ""]),
    st.sampled_from(["", ":", *(f":{strategy.value}" for strategy in Strategy)]),
)
WIRE_LIKE = st.one_of(st.lists(_WIRE_PARTS, max_size=5).map("".join), _GENERIC, TEXT)


@EXAMPLES
@given(tag=TAGS)
def test_every_tag_round_trips_through_its_wire_form(tag: RequestTag) -> None:
    assert RequestTag.parse(tag.wire) == tag


@EXAMPLES
@given(wire=WIRE_LIKE)
def test_a_wire_string_parses_only_back_to_the_tag_that_writes_it(wire: str) -> None:
    try:
        tag = RequestTag.parse(wire)
    except ValueError:
        return
    assert tag.wire == wire


@pytest.mark.parametrize(
    "wire", ["distill/seed", "distill/variant:harder", "amplify/seed:paraphrase", "judge/seed:"]
)
def test_a_tag_is_not_read_from_a_form_no_stage_writes(wire: str) -> None:
    # Each is another spelling of a tag whose wire form is another ("seed", "variant:harder",
    # "paraphrase", "judge/seed"): no stage writes it, so it is no tag.
    with pytest.raises(ValueError, match="not a request tag"):
        RequestTag.parse(wire)


@EXAMPLES
@given(strategy=st.sampled_from(list(Strategy)), as_text=st.booleans())
def test_a_variant_tag_parses_back_to_its_strategy(strategy: Strategy, as_text: bool) -> None:
    tag = variant_tag(strategy.value if as_text else strategy)
    assert parse_tag(tag) == ("variant", strategy)
    assert parse_tag("seed") == ("seed", None)


@EXAMPLES
@given(wire=WIRE_LIKE)
def test_parse_tag_reads_a_distillation_tag_or_raises_value_error(wire: str) -> None:
    try:
        origin, strategy = parse_tag(wire)
    except ValueError:
        with pytest.raises(ValueError, match="not a distillation tag"):
            parse_tag(wire)
        return
    # Only what the stage writes: a seed ("seed") or a variant of a strategy ("variant:S").
    if origin == "seed":
        assert (wire, strategy) == ("seed", None)
    else:
        assert strategy is not None
        assert wire == variant_tag(strategy)


@pytest.mark.parametrize("wire", ["distill/seed:paraphrase", "distill/variant"])
def test_parse_tag_refuses_a_seed_with_a_strategy_and_a_variant_without_one(wire: str) -> None:
    # Read as ("seed", paraphrase) and ("variant", None): a seed's answer would get a strategy
    # and a variant's none, though no stage writes either tag.
    with pytest.raises(ValueError, match="not a distillation tag"):
        parse_tag(wire)


# ---- 5. the distill stage: requests, parse, sink -------------------------------------------------


class Answer(BaseModel):
    answer: str
    confidence: float


_TOOL = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
PROMPTS = st.text(st.one_of(st.characters(codec="utf-8"), st.sampled_from(_ODD)), min_size=1)


@st.composite
def _seeds(draw: st.DrawFn) -> list[SeedPrompt]:
    """Seeds with unique ids (landing keeps the first of an id); prompts may repeat."""
    ids = draw(st.lists(TEXT.filter(bool), min_size=1, max_size=4, unique=True))
    prompts = draw(st.lists(PROMPTS, min_size=1, max_size=2))
    seeds: list[SeedPrompt] = []
    for line, input_id in enumerate(ids, start=1):
        prompt = draw(st.sampled_from(prompts))
        instructions = draw(st.one_of(st.none(), TEXT))
        params: dict[str, Any] = draw(
            st.sampled_from([{}, {"max_tokens": 64}, {"tools": [_TOOL]}, {"temperature": 0.0}])
        )
        seeds.append(
            SeedPrompt.model_validate(
                {
                    "input_id": input_id,
                    "messages": [{"role": "user", "content": prompt}],
                    "prompt": prompt,
                    "instructions": instructions,
                    "params": params,
                    "source_file": "seeds.jsonl",
                    "line": line,
                }
            )
        )
    return seeds


@st.composite
def _variants(draw: st.DrawFn, seeds: list[SeedPrompt]) -> list[AmplifiedRow]:
    picked = draw(st.lists(st.sampled_from(seeds), max_size=4))
    return [
        AmplifiedRow.model_validate(
            {
                **generation_columns(make_result(input_id=seed.input_id, request_id=f"v{i}")),
                "seed_id": seed.input_id,
                "strategy": draw(st.sampled_from(list(Strategy))).value,
                "prompt": draw(PROMPTS),
            }
        )
        for i, seed in enumerate(picked)
    ]


# An answer's JSON as the model writes it: any number JSON allows (1e999 too: no float holds
# it), the literals Python's JSON reads (NaN, Infinity), in a fence or not.
_NUMBERS = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.sampled_from(["1e999", "-1e999", "NaN", "Infinity", "-Infinity", "1e308", "0", "-0"]),
)
ANSWER_TEXTS = st.builds(
    '{{"answer": {}, "confidence": {}}}'.format,
    TEXT.map(lambda text: json.dumps(text, ensure_ascii=False)),
    _NUMBERS,
).flatmap(lambda text: st.sampled_from([text, f"```json\n{text}\n```", f"```{text}```"]))


@st.composite
def _partitions(draw: st.DrawFn) -> tuple[DistillInputs, list[GenerationResult]]:
    """A partition's seeds and variants, and one drawn result for each of its requests."""
    seeds = draw(_seeds())
    inputs = DistillInputs(seeds=seeds, variants=draw(_variants(seeds)))
    results: list[GenerationResult] = []
    for index, request in enumerate(distillation_requests(inputs.seeds, inputs.variants)):
        fields = draw(_result_fields())
        if draw(st.booleans()):  # an answer for the schema half the time
            fields["text"] = draw(ANSWER_TEXTS)
        results.append(
            make_result(
                request_id=f"r{index}", input_id=request.input_id, tag=request.tag, **fields
            )
        )
    return inputs, results


@FEW
@given(seeds=_seeds(), data=st.data(), n_probs=st.integers(0, 20), schema=st.booleans())
def test_distillation_requests_are_deterministic_one_per_seed_and_variant(
    seeds: list[SeedPrompt], data: st.DataObject, n_probs: int, schema: bool
) -> None:
    variants = data.draw(_variants(seeds))
    output_model = Answer if schema else None
    first = distillation_requests(seeds, variants, n_probs=n_probs, output_model=output_model)
    again = distillation_requests(seeds, variants, n_probs=n_probs, output_model=output_model)
    assert [r.model_dump_json() for r in first] == [r.model_dump_json() for r in again]
    assert [(r.input_id, r.tag) for r in first] == [
        *((seed.input_id, "seed") for seed in seeds),
        *((variant.request_id, variant_tag(variant.strategy)) for variant in variants),
    ]
    # Every request of the partition names its own input (seeds by id, variants by request id).
    assert len({(r.input_id, r.tag) for r in first}) == len(first)


@EXAMPLES
@given(partition=_partitions(), schema=st.booleans(), failures=FAILURES)
def test_every_distill_result_lands_once_as_a_row_or_a_quarantine_row(
    partition: tuple[DistillInputs, list[GenerationResult]],
    schema: bool,
    failures: list[FailedRequest],
) -> None:
    inputs, results = partition
    output_model = Answer if schema else None
    sink = StageSink(DistillTask(output_model=output_model), inputs, input_sha256="sha")
    rows = list(sink.rows(results))
    sink.failed(failures, source_file="seeds", model="m", digest_sha="d", created_at=NOW)
    quarantined = sink.quarantined
    set_aside, failed = (
        quarantined[: len(quarantined) - len(failures)],
        quarantined[-len(failures) :] if failures else [],
    )

    # Exactly once each: a row or a set-aside, never both, never lost.
    landed = [row.request_id for row in rows] + [str(row.request_id) for row in set_aside]
    assert sorted(landed) == sorted(result.request_id for result in results)
    assert [row.request_id for row in failed] == [failure.request_id for failure in failures]

    by_id = {result.request_id: result for result in results}
    for row in rows:
        result = by_id[row.request_id]
        _check_row(row, result, inputs, output_model)
    for aside in set_aside:
        result = by_id[str(aside.request_id)]
        _check_set_aside(aside, result, inputs, output_model)
    figures = sink.figures()
    assert (figures.results, figures.rows) == (len(results), len(rows))


@pytest.mark.parametrize("number", ["1e999", "-1e999", "NaN", "Infinity"])
def test_an_answer_whose_number_json_cannot_hold_is_set_aside(number: str) -> None:
    # 1e999 is JSON (a schema's grammar lets the model write it) but reads as infinity, which
    # the canonical JSON wrote as null: a `structured` {"confidence": null} its schema refuses.
    seed = _one_seed()
    text = f'{{"answer": "4", "confidence": {number}}}'
    result = make_result(text, input_id=seed.input_id, tag="seed")
    parsed = DistillTask(output_model=Answer).parse(result, DistillInputs(seeds=[seed]))
    assert isinstance(parsed, SetAside)
    assert parsed.reason.startswith("answer does not match Answer")
    assert "confidence" in parsed.reason


class MaybeAnswer(BaseModel):
    answer: str
    confidence: float | None
    extra: dict[str, float | None] = {}


@pytest.mark.parametrize(
    "fields", ['"confidence": 1e999', '"confidence": NaN', '"confidence": 1, "extra": {"a": 1e999}']
)
def test_an_answer_that_would_read_back_as_another_is_set_aside(fields: str) -> None:
    # An optional field or a dict's value takes the null that 1e999 or NaN is written as: the
    # schema accepts it, and the row held an answer the model never gave.
    seed = _one_seed()
    text = f'{{"answer": "4", {fields}}}'
    result = make_result(text, input_id=seed.input_id, tag="seed")
    parsed = DistillTask(output_model=MaybeAnswer).parse(result, DistillInputs(seeds=[seed]))
    assert isinstance(parsed, SetAside)
    assert parsed.reason.startswith("answer does not match MaybeAnswer once written as JSON")


class NotedAnswer(BaseModel):
    answer: str
    _seen: str = PrivateAttr(default_factory=lambda: uuid.uuid4().hex)


def test_an_answer_whose_model_keeps_private_state_is_kept() -> None:
    # Comparing the answer with its JSON read back also compared private attributes: a user's
    # output model with one had every answer set aside.
    seed = _one_seed()
    result = make_result('{"answer": "4"}', input_id=seed.input_id, tag="seed")
    parsed = DistillTask(output_model=NotedAnswer).parse(result, DistillInputs(seeds=[seed]))
    assert not isinstance(parsed, SetAside)


def _one_seed() -> SeedPrompt:
    return SeedPrompt.model_validate(
        {
            "input_id": "s1",
            "messages": [{"role": "user", "content": "q"}],
            "prompt": "q",
            "source_file": "seeds.jsonl",
            "line": 1,
        }
    )


def _seed_of(result: GenerationResult, inputs: DistillInputs) -> tuple[SeedPrompt, str]:
    """The result's seed and the prompt it answered."""
    if result.tag == "seed":
        seed = inputs.by_id[result.input_id]
        return seed, seed.prompt
    variant = inputs.variants_by_id[result.input_id]
    return inputs.by_id[variant.seed_id], variant.prompt


def _check_row(
    row: DistilledRow,
    result: GenerationResult,
    inputs: DistillInputs,
    output_model: type[BaseModel] | None,
) -> None:
    seed, prompt = _seed_of(result, inputs)
    assert DistilledRow.model_validate(row.model_dump()) == row
    assert _storable(row.model_dump())
    columns = generation_columns(result)
    assert row.model_dump(include=set(columns)) == columns
    assert row.input_sha256 == "sha"
    origin, strategy = parse_tag(result.tag)
    assert (row.seed_id, row.origin, row.prompt) == (seed.input_id, origin, prompt)
    assert row.strategy == (strategy.value if strategy else None)
    # The answer as the model wrote it (less outer whitespace), its thinking apart.
    assert row.response == result.text.strip()
    assert row.reasoning == (result.reasoning_content or None)
    assert not result.truncated
    assert row.response or result.tool_calls
    if result.tool_calls:
        assert row.tool_calls is not None
        calls = [ToolCall.model_validate(call) for call in json.loads(row.tool_calls)]
        assert calls == result.tool_calls
    else:
        assert row.tool_calls is None
    assert (json.loads(row.tools) if row.tools else None) == seed.params.tools
    if output_model is None:
        assert row.structured is None
    else:
        assert row.structured is not None
        assert output_model.model_validate_json(row.structured).model_dump_json() == row.structured


def _check_set_aside(
    aside: QuarantineRow,
    result: GenerationResult,
    inputs: DistillInputs,
    output_model: type[BaseModel] | None,
) -> None:
    seed, _ = _seed_of(result, inputs)
    assert (aside.stage, aside.input_id, aside.source_file, aside.line) == (
        "distill",
        result.input_id,
        seed.source_file,
        seed.line,
    )
    assert aside.raw == truncate_raw(result.text)
    assert aside.input_sha256 == "sha"
    assert QuarantineRow.model_validate(aside.model_dump()) == aside
    assert _storable(aside.model_dump())
    if not result.text.strip() and not result.tool_calls:
        assert aside.reason == EMPTY_REASON
    elif output_model is not None and aside.reason.startswith("answer does not match"):
        pass
    else:
        assert result.truncated
        assert aside.reason == TRUNCATED_REASON


# ---- 6. a fenced JSON answer ---------------------------------------------------------------------

# What `_unfenced` replaced: right on short text, cubic on an opened fence that never closes.
_FENCED_JSON = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.IGNORECASE | re.S)
FENCE_TEXT = st.lists(
    st.sampled_from(["```", "`", "json", "JSON", "js", " ", "\n", "\t", "{}", '{"a": 1}', "x"]),
    max_size=8,
).map("".join)


@EXAMPLES
@given(text=st.one_of(FENCE_TEXT, TEXT))
def test_a_fence_is_unwrapped_as_the_fence_pattern_reads_it(text: str) -> None:
    match = _FENCED_JSON.match(text.strip())
    assert _unfenced(text) == (match.group(1) if match else text)


@pytest.mark.parametrize("filler", [" ", "\n", " \n"])
def test_an_unclosed_fence_of_whitespace_is_set_aside_at_once(filler: str) -> None:
    # The fence regex backtracked cubically here: 2,000 spaces took 6 s, 8,000 over 6 minutes,
    # on the thread that lands the partition.
    text = "```json\n" + filler * 5_000 + "{"
    seed = _one_seed()
    result = make_result(text, input_id="s1", tag="seed", finish_reason="stop")
    started = time.perf_counter()
    parsed = DistillTask(output_model=Answer).parse(result, DistillInputs(seeds=[seed]))
    assert time.perf_counter() - started < 2.0
    assert isinstance(parsed, SetAside)
    assert parsed.reason.startswith("answer does not match Answer")
