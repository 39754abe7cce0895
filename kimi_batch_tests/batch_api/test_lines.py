"""OpenAI Batch lines: validation of a batch input, and the one output/error line writer."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from kimi_batch.batch_api.lines import AnsweredRequest, parse_batch_input, response_line
from kimi_batch.cli.export import export_partition
from kimi_batch.llama import TokenLogprob, ToolCall, TopLogprob
from kimi_batch.pipeline import result_row
from kimi_batch.settings import Settings
from kimi_batch.warehouse import Warehouse
from kimi_batch_tests.support.results import make_result
from kimi_batch_tests.support.rows import CREATED_AT, amplified, distilled

URL = "/v1/chat/completions"


def line(custom_id: str, **body: Any) -> bytes:
    body.setdefault("messages", [{"role": "user", "content": "Hi."}])
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": URL, "body": body}).encode()


def test_a_request_keeps_everything_it_asked_for() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    parsed = parse_batch_input(
        [
            line(
                "q1",
                messages=[
                    {"role": "system", "content": "You are terse."},
                    {"role": "user", "content": "One?"},
                    {"role": "assistant", "content": "1"},
                    {"role": "user", "content": [{"type": "text", "text": "Two?"}]},
                ],
                max_completion_tokens=40,
                temperature=0.0,
                seed=5,
                logprobs=True,
                top_logprobs=3,
                response_format={"type": "json_schema", "json_schema": {"schema": schema}},
            ),
            b"",
            line("q2"),
        ],
        endpoint=URL,
    )
    assert parsed.errors == []
    first, second = parsed.lines
    assert first.system == "You are terse."
    assert [(m.role, m.content) for m in first.messages] == [
        ("user", "One?"),
        ("assistant", "1"),
        ("user", "Two?"),
    ]
    assert first.params.max_tokens == 40
    assert (first.params.temperature, first.params.seed) == (0.0, 5)
    assert first.params.n_probs == 3
    assert first.top_logprobs == 3
    assert first.params.json_schema == schema
    # OpenAI's defaults where the request says nothing; no logprobs unless asked.
    assert (second.params.temperature, second.params.top_p, second.params.n_probs) == (1, 1, 0)
    assert second.top_logprobs is None
    assert second.line == 3


def test_every_bad_line_is_named_and_no_request_is_kept() -> None:
    parsed = parse_batch_input(
        [
            line("a"),
            line("a"),
            b"[1, 2]",
            b"{oops",
            json.dumps(
                {"custom_id": "c", "method": "POST", "url": "/v1/embeddings", "body": {}}
            ).encode(),
            line(
                "d", messages=[{"role": "user", "content": "x"}, {"role": "system", "content": "y"}]
            ),
            line("e", temperature=3),
        ],
        endpoint=URL,
    )
    assert parsed.lines == []
    assert [(e.code, e.line) for e in parsed.errors] == [
        ("duplicate_custom_id", 2),
        ("invalid_json_line", 3),
        ("invalid_json_line", 4),
        ("invalid_url", 5),
        ("invalid_request", 6),
        ("invalid_request", 7),
    ]
    assert parsed.errors[-1].param == "body.temperature"


def test_an_output_line_parses_as_the_sdks_chat_completion() -> None:
    top = [TopLogprob(token="x", logprob=-0.1), TopLogprob(token="y", logprob=-2.0)]
    result = make_result(
        '{"a": 1}',
        input_id="q1",
        finish_reason="length",
        reasoning_content="thinking",
        logprobs=[TokenLogprob(token="{", logprob=-0.1, top=top)],
    )
    answer = AnsweredRequest.from_result(result, custom_id="q1")
    line_ = json.loads(response_line(answer, top_logprobs=1))
    assert line_["custom_id"] == "q1"
    assert line_["response"]["status_code"] == 200
    completion = ChatCompletion.model_validate(line_["response"]["body"])
    choice = completion.choices[0]
    assert choice.finish_reason == "length"
    assert choice.message.content == '{"a": 1}'
    assert choice.message.model_extra == {"reasoning_content": "thinking"}
    assert choice.logprobs is not None
    assert choice.logprobs.content is not None
    assert all(len(token.top_logprobs) == 1 for token in choice.logprobs.content)
    assert completion.usage is not None
    assert completion.usage.total_tokens == result.prompt_tokens + result.completion_tokens


def test_a_completion_line_s_output_parses_as_the_sdks_text_completion() -> None:
    top = [TopLogprob(token=" upon", logprob=-0.1), TopLogprob(token=" a", logprob=-2.0)]
    tokens = [
        TokenLogprob(token=" upon", logprob=-0.1, top=top),
        TokenLogprob(token=" a", logprob=-0.5, top=top),
    ]
    result = make_result(" upon a", input_id="c1", logprobs=tokens, finish_reason="length")
    answer = AnsweredRequest.from_result(result, custom_id="c1")
    body = json.loads(response_line(answer, top_logprobs=1, kind="completion"))["response"]["body"]
    completion = Completion.model_validate(body)
    assert completion.object == "text_completion"
    [choice] = completion.choices
    assert (choice.text, choice.finish_reason) == (" upon a", "length")
    assert choice.logprobs is not None
    assert choice.logprobs.tokens == [" upon", " a"]
    assert choice.logprobs.token_logprobs == [-0.1, -0.5]
    assert choice.logprobs.top_logprobs == [{" upon": -0.1}, {" upon": -0.1}]
    assert choice.logprobs.text_offset == [0, 5]
    assert completion.usage is not None
    assert completion.usage.total_tokens == result.prompt_tokens + result.completion_tokens


def test_an_answer_s_tool_calls_reach_its_output_line() -> None:
    call = ToolCall.model_validate(
        {"id": "call_1", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}
    )
    result = make_result("", finish_reason="tool_calls", tool_calls=[call])
    line_ = json.loads(response_line(AnsweredRequest.from_result(result, custom_id="t")))
    choice = ChatCompletion.model_validate(line_["response"]["body"]).choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None  # OpenAI's shape of an answer that only calls
    [made] = choice.message.tool_calls or []
    assert made.type == "function"
    assert (made.id, made.function.name) == ("call_1", "get_weather")  # type: ignore[union-attr]
    assert json.loads(made.function.arguments) == {"city": "Paris"}  # type: ignore[union-attr]


def test_export_reads_utc_keeps_reasoning_and_logprobs_and_names_variants_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path))
    # A timezone far from UTC: a naive UTC time read as local would be off by nine hours.
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    try:
        warehouse = Warehouse(tmp_path / "warehouse")
        variants = amplified(2)
        answers = [
            row.model_copy(update={"reasoning": "because"}) for row in distilled(variants[:1])
        ]
        set_aside = make_result("cut", input_id=variants[1].request_id, finish_reason="length")
        failed = result_row(
            set_aside, stage="distill", source_file="in.jsonl", line=2, reason="cut off"
        )
        warehouse.write_partition("amplified", "2026-11-30", "batch", variants)
        warehouse.write_partition("distilled", "2026-11-30", "batch", answers)
        warehouse.write_partition("quarantine", "2026-11-30", "batch", [failed])
        path = export_partition(
            Settings.from_env(), ds="2026-11-30", source="batch", fmt="openai-batch", out=None
        )
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    ok, error = (json.loads(text) for text in path.read_text().splitlines())
    body = ok["response"]["body"]
    assert body["created"] == int(CREATED_AT.timestamp())
    assert body["choices"][0]["message"]["reasoning_content"] == "because"
    tokens = body["choices"][0]["logprobs"]["content"]
    assert [t["token"] for t in tokens] == ["Paris"]
    assert [t["token"] for t in tokens[0]["top_logprobs"]] == ["Paris", "Lyon"]
    assert ok["custom_id"] == f"seed-0:paraphrase:{variants[0].request_id}"
    assert error["custom_id"] == f"seed-1:paraphrase:{variants[1].request_id}"
    assert error["error"] == {"code": "quarantined", "message": "cut off"}


def test_a_response_object_echoes_the_lines_tool_fields() -> None:
    weather = {
        "type": "function",
        "name": "get_weather",
        "description": "Today's weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
    record = {
        "custom_id": "r1",
        "method": "POST",
        "url": "/v1/responses",
        "body": {
            "model": "m",
            "input": "Weather in Oslo?",
            "tools": [weather],
            "tool_choice": "required",
            "parallel_tool_calls": False,
        },
    }
    [line] = parse_batch_input([json.dumps(record).encode()], endpoint="/v1/responses").lines
    answer = AnsweredRequest.from_result(make_result("", input_id="r1"), custom_id="r1")
    body = json.loads(response_line(answer, kind="responses", params=line.params))
    echoed = Response.model_validate(body["response"]["body"])
    assert (echoed.tool_choice, echoed.parallel_tool_calls) == ("required", False)
    assert [tool.model_dump(exclude_none=True) for tool in echoed.tools] == [weather]
    plain = json.loads(response_line(answer, kind="responses"))["response"]["body"]
    assert (plain["tools"], plain["tool_choice"], plain["parallel_tool_calls"]) == (
        [],
        "auto",
        True,
    )


def test_a_responses_line_s_output_parses_as_the_sdks_response() -> None:
    call = ToolCall.model_validate(
        {"id": "call_2", "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}}
    )
    answered = make_result("It is", input_id="r1", finish_reason="length", tool_calls=[call])
    answer = AnsweredRequest.from_result(answered, custom_id="r1")
    body = json.loads(response_line(answer, kind="responses"))["response"]["body"]
    response = Response.model_validate(body)
    assert (response.object, response.status) == ("response", "incomplete")
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output_text == "It is"
    [message, made] = response.output
    assert message.type == "message"
    assert made.type == "function_call"
    assert (made.call_id, made.name, made.arguments) == ("call_2", "get_weather", '{"city":"Oslo"}')
    assert response.usage is not None
    assert response.usage.input_tokens == answered.prompt_tokens
    assert response.usage.output_tokens == answered.completion_tokens
    finished = make_result("Done.", input_id="r2")
    done = json.loads(
        response_line(AnsweredRequest.from_result(finished, custom_id="r2"), kind="responses")
    )
    complete = Response.model_validate(done["response"]["body"])
    assert (complete.status, complete.incomplete_details, complete.output_text) == (
        "completed",
        None,
        "Done.",
    )
