"""Distillation requests and rows, incl. logprobs and schema-validated JSON (no server)."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel, Field, ValidationError

from kimi_batch.engine import INSTRUCTIONS_OPEN
from kimi_batch.engine.generation import GenerationResult, SamplingParams
from kimi_batch.inputs.prompts import ParamOverrides, SeedPrompt
from kimi_batch.llama import ToolCall
from kimi_batch.llama.responses import TokenLogprob, TopLogprob
from kimi_batch.pipeline import (
    DEFAULT_DISTILL_PARAMS,
    EMPTY_REASON,
    TRUNCATED_REASON,
    AmplifiedRow,
    DistilledRow,
    DistillInputs,
    DistillTask,
    PartitionSkippedError,
    QuarantineRow,
    StageSink,
    distillation_requests,
    generation_columns,
    parse_tag,
    variant_tag,
)
from kimi_batch_tests.support.results import make_result


class Answer(BaseModel):
    answer: str
    confidence: float


def _seed(
    input_id: str, prompt: str, *, instructions: str | None = None, line: int = 1
) -> SeedPrompt:
    content = (
        f"{INSTRUCTIONS_OPEN}\n{instructions}\n</instructions>\n\n{prompt}"
        if instructions
        else prompt
    )
    return SeedPrompt.model_validate(
        {
            "input_id": input_id,
            "messages": [{"role": "user", "content": content}],
            "prompt": prompt,
            "instructions": instructions,
            "params": {"max_tokens": 64} if instructions else {},
            "source_file": "seeds.jsonl",
            "line": line,
        }
    )


def _result(
    text: str,
    *,
    input_id: str,
    tag: str,
    request_id: str,
    finish_reason: str = "stop",
    logprobs: list[TokenLogprob] | None = None,
) -> GenerationResult:
    return make_result(
        text,
        input_id=input_id,
        tag=tag,
        request_id=request_id,
        finish_reason=finish_reason,
        prompt_tokens=200,
        cached_tokens=180,
        completion_tokens=30,
        slot_id=1,
        logprobs=logprobs,
    )


def _variant(seed_id: str, prompt: str, request_id: str, strategy: str = "harder") -> AmplifiedRow:
    result = _result(prompt, input_id=seed_id, tag=strategy, request_id=request_id)
    return AmplifiedRow.model_validate(
        {**generation_columns(result), "seed_id": seed_id, "strategy": strategy, "prompt": prompt}
    )


SEEDS = [
    _seed("s1", "Why is the sky blue?", line=1),
    _seed("s2", "What is 7 times 8?", instructions="Answer in French.", line=2),
]
VARIANTS = [
    _variant("s1", "Why is the sunset red?", "v1", "related"),
    _variant("s2", "What is 7 times 8 times 9?", "v2", "harder"),
]


def _distilled(
    results: list[GenerationResult], output_model: type[BaseModel] | None = None
) -> tuple[list[DistilledRow], list[QuarantineRow]]:
    """(rows by request id, set-asides in parse order) of `results` through the stage's sink,
    as the asset lands them."""
    sink = StageSink(
        DistillTask(output_model=output_model), DistillInputs(seeds=SEEDS, variants=VARIANTS)
    )
    rows = sorted(sink.rows(results), key=lambda row: row.request_id)
    return rows, sink.quarantined


def test_requests_for_seeds_and_variants() -> None:
    requests = distillation_requests(SEEDS, VARIANTS)

    assert [(r.input_id, r.tag) for r in requests] == [
        ("s1", "seed"),
        ("s2", "seed"),
        ("v1", "variant:related"),
        ("v2", "variant:harder"),
    ]
    assert requests[0].messages == SEEDS[0].messages
    assert requests[0].params == DEFAULT_DISTILL_PARAMS
    assert requests[1].params.max_tokens == 64  # the row's override
    (variant_message,) = requests[3].messages
    assert variant_message.role == "user"
    # The seed's instructions still hold for its variants, and so do its overrides.
    assert variant_message.content.startswith(INSTRUCTIONS_OPEN)
    assert "Answer in French." in variant_message.content
    assert variant_message.content.endswith("What is 7 times 8 times 9?")
    assert requests[3].params.max_tokens == 64
    assert requests[2].messages[0].content == "Why is the sunset red?"
    assert all(m.role != "system" for r in requests for m in r.messages)


def test_requests_carry_n_probs_and_the_output_schema() -> None:
    requests = distillation_requests(
        SEEDS, [], SamplingParams(temperature=0.0), n_probs=5, output_model=Answer
    )

    assert all(r.params.n_probs == 5 for r in requests)
    assert requests[0].params.json_schema == Answer.model_json_schema()
    assert requests[0].params.temperature == 0.0
    assert distillation_requests(SEEDS[:1])[0].params.json_schema is None
    with pytest.raises(ValidationError):
        distillation_requests(SEEDS, n_probs=99)
    with pytest.raises(PartitionSkippedError, match="older version of its input"):
        distillation_requests(SEEDS[:1], VARIANTS)


def test_tags_round_trip() -> None:
    assert parse_tag("seed") == ("seed", None)
    assert parse_tag(variant_tag("paraphrase")) == ("variant", "paraphrase")
    with pytest.raises(ValueError, match="not a distillation tag"):
        parse_tag("paraphrase")


def test_rows_keep_provenance_and_logprobs_and_only_final_answers() -> None:
    logprobs = [
        TokenLogprob(token="Blue", logprob=-0.1, top=[TopLogprob(token="Blue", logprob=-0.1)])
    ]
    results = [
        _result("  Le résultat est 504.  ", input_id="v2", tag="variant:harder", request_id="c"),
        _result("", input_id="s2", tag="seed", request_id="b"),
        _result(
            "Rayleigh scattering.", input_id="s1", tag="seed", request_id="a", logprobs=logprobs
        ),
        _result("Dust and low sun.", input_id="v1", tag="variant:related", request_id="d"),
    ]

    results.append(
        _result(
            "Because the light", input_id="s2", tag="seed", request_id="e", finish_reason="length"
        )
    )

    rows, quarantined = _distilled(results)

    # An empty answer and one cut off at max_tokens are never final answers: set aside, visible.
    assert [(q.request_id, q.reason) for q in quarantined] == [
        ("b", EMPTY_REASON),
        ("e", TRUNCATED_REASON),
    ]
    assert quarantined[1].raw == "Because the light"
    assert [(r.request_id, r.seed_id, r.origin, r.strategy, r.input_id) for r in rows] == [
        ("a", "s1", "seed", None, "s1"),
        ("c", "s2", "variant", "harder", "v2"),
        ("d", "s1", "variant", "related", "v1"),
    ]
    by_request = {row.request_id: row for row in rows}
    assert by_request["a"].logprobs == logprobs
    assert by_request["a"].prompt == "Why is the sky blue?"
    assert by_request["a"].cached_tokens == 180
    assert by_request["c"].response == "Le résultat est 504."
    assert by_request["c"].prompt == "What is 7 times 8 times 9?"
    assert by_request["d"].structured is None


def test_structured_output_is_validated_and_bad_json_quarantined() -> None:
    results = [
        _result(
            '{"answer": "Rayleigh scattering", "confidence": 0.9}',
            input_id="s1",
            tag="seed",
            request_id="a",
        ),
        _result(
            '```json\n{"answer": "56", "confidence": 1}\n```',
            input_id="s2",
            tag="seed",
            request_id="b",
        ),
        _result('{"answer": "Dust"}', input_id="v1", tag="variant:related", request_id="c"),
        _result(
            '{"answer": "504", "confid',
            input_id="v2",
            tag="variant:harder",
            request_id="d",
            finish_reason="length",
        ),
    ]

    rows, quarantined = _distilled(results, output_model=Answer)

    assert [row.request_id for row in rows] == ["a", "b"]
    assert rows[0].structured == '{"answer":"Rayleigh scattering","confidence":0.9}'
    assert Answer.model_validate_json(rows[1].structured or "") == Answer(
        answer="56", confidence=1.0
    )
    reasons = {row.request_id: row for row in quarantined}
    assert set(reasons) == {"c", "d"}
    assert reasons["c"].reason == "answer does not match Answer: confidence: Field required"
    assert reasons["d"].reason.endswith("(cut off at max_tokens)")
    assert (reasons["d"].stage, reasons["d"].source_file, reasons["d"].line) == (
        "distill",
        "seeds.jsonl",
        2,
    )
    assert reasons["d"].raw == '{"answer": "504", "confid'


class Labelled(BaseModel):
    """A field whose JSON name is a Python keyword: the schema asks for the alias."""

    label: str = Field(alias="class")


def test_structured_output_is_stored_in_the_json_its_schema_asks_for() -> None:
    """Found by review: stored by field name (`{"label": ...}`), the column held JSON its own
    schema refuses, so `output_model.model_validate_json(row.structured)` failed."""
    assert "class" in Labelled.model_json_schema()["properties"]
    results = [_result('{"class": "noun"}', input_id="s1", tag="seed", request_id="a")]

    (row,), _ = _distilled(results, output_model=Labelled)

    assert row.structured == '{"class":"noun"}'
    assert Labelled.model_validate_json(row.structured) == Labelled(**{"class": "noun"})


def test_rows_reject_results_that_match_nothing() -> None:
    stray = _result("x", input_id="v9", tag="variant:harder", request_id="z")
    with pytest.raises(ValueError, match="matches no seed or variant"):
        _distilled([stray])


def test_an_answer_keeps_its_tool_calls_and_its_seed_s_tools() -> None:
    """Issue 45 item 2: the row keeps the tools the seed offered and the calls the answer made;
    an answer that only calls a tool (no text) is a final answer."""
    tools = [{"type": "function", "function": {"name": "get_weather"}}]
    seed = _seed("t1", "Weather in Paris?").model_copy(
        update={"params": ParamOverrides(tools=tools)}
    )
    call = ToolCall.model_validate(
        {"id": "c", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}
    )
    [request] = distillation_requests([seed])
    assert request.params.tools == tools
    result = _result("", input_id="t1", tag="seed", request_id="r-t1", finish_reason="tool_calls")
    result = result.model_copy(update={"tool_calls": [call]})
    sink = StageSink(DistillTask(), DistillInputs(seeds=[seed, *SEEDS], variants=VARIANTS))
    [row] = list(sink.rows([result]))
    assert row.tools is not None
    assert json.loads(row.tools) == tools
    assert row.tool_calls is not None
    assert json.loads(row.tool_calls) == [call.model_dump(mode="json")]
    [plain] = _distilled([_result("Rayleigh.", input_id="s1", tag="seed", request_id="r-s1")])[0]
    assert (plain.tools, plain.tool_calls) == (None, None)
