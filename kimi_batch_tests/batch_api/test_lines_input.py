"""A Batch API input validated as it streams: every line-level failure is that line's error."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from kimi_batch.batch_api.lines import (
    MAX_NESTING,
    parse_batch_input,
    scan_batch_input,
    served_models,
)
from kimi_batch.inputs.reader import read_inbox_file
from kimi_batch.llama import chat_body, completion_body
from kimi_batch.settings import Settings
from kimi_batch_tests.support.batches import chat_line

URL = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def _line(custom_id: str, content: str = "Hi.", **body: object) -> bytes:
    return json.dumps(chat_line(custom_id, content, **body)).encode()


def test_lines_that_break_the_json_parser_or_the_models_are_line_errors() -> None:
    deep = b'{"custom_id": "deep", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    huge = b'{"custom_id": "huge", "n": ' + b"9" * 5000 + b"}"
    nested = _line(
        "nested", temperature=0, response_format={"type": "json_schema", "json_schema": {}}
    )
    nested = nested.replace(
        b'"json_schema": {}', b'"json_schema": ' + b'{"a": ' * 100 + b"1" + b"}" * 100
    ).replace(b'"temperature": 0', b'"temperature": NaN')  # too deep is said first
    wrong_types = json.dumps(
        {"custom_id": 7, "method": "POST", "url": URL, "body": {"messages": "hi"}}
    ).encode()
    surrogate = _line("s", content="\ud800")
    lines = [_line("ok"), deep, huge, b"\xff\xfe not utf-8", wrong_types, nested, surrogate]
    parsed = parse_batch_input(lines, endpoint=URL)
    assert parsed.lines == []
    assert [(e.code, e.line) for e in parsed.errors] == [
        ("invalid_json_line", 2),
        ("invalid_json_line", 3),
        ("invalid_json_line", 4),
        ("invalid_request", 5),
        ("invalid_json_line", 6),
        ("invalid_request", 7),
    ]
    messages = [e.message for e in parsed.errors]
    assert "nested too deeply" in messages[0]
    assert "4300 digits" in messages[1]
    assert "not valid UTF-8" in messages[2]
    assert parsed.errors[3].param == "custom_id"
    assert f"deeper than {MAX_NESTING}" in messages[4]
    assert parsed.errors[4].param is None
    assert "surrogates not allowed" in messages[5]
    assert all(m.startswith(f"line {e.line}") for m, e in zip(messages, parsed.errors, strict=True))


def test_a_batch_over_the_request_limit_fails_on_the_first_line_past_it() -> None:
    data = b"".join(_line(f"r{i}") + b"\n" for i in range(5))
    scan = scan_batch_input(io.BytesIO(data), endpoint=URL, max_requests=3)
    assert scan.request_total == 0
    [error] = scan.errors
    assert (error.code, error.line) == ("too_many_requests", 4)
    assert "at most 3 requests" in error.message
    ok = scan_batch_input(io.BytesIO(data), endpoint=URL, max_requests=5)
    assert (ok.request_total, ok.errors) == (5, [])


def test_scanning_calls_back_after_every_line_and_keeps_no_request() -> None:
    seen: list[int] = []
    data = b"".join(_line(f"r{i}") + b"\n\n" for i in range(4))
    scan = scan_batch_input(io.BytesIO(data), endpoint=URL, on_line=lambda: seen.append(1))
    assert scan.request_total == 4
    assert len(seen) == 4  # blank lines are skipped
    assert not hasattr(scan, "lines")


def _raw(custom_id: str, body: dict[str, object], url: str = URL) -> bytes:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body}).encode()


def test_a_field_the_server_would_not_apply_fails_its_line_naming_the_field() -> None:
    """A batch runs the request it was given or none: nothing is dropped silently."""
    called = {"role": "assistant", "content": "", "tool_calls": [{"id": "c1"}]}
    lines = [
        _line("ok", stop=["\n"], user="u1", metadata={"k": "v"}),
        _line("legacy", functions=[{"name": "f"}]),
        _line("named", tools=[WEATHER], tool_choice={"type": "function", "function": WEATHER_FN}),
        _line("unknown", reasoning_effort="high"),
        _line("two", n=2),
        _raw("name", {"messages": [{"role": "user", "content": "Hi.", "name": "ann"}]}),
        _raw("turns", {"messages": [{"role": "user", "content": "Hi."}, called]}),
    ]
    parsed = parse_batch_input(lines, endpoint=URL)
    assert [(e.code, e.line, e.param) for e in parsed.errors] == [
        ("unsupported_field", 2, "body.functions"),
        ("unsupported_field", 3, "body.tool_choice"),
        ("unsupported_field", 4, "body.reasoning_effort"),
        ("unsupported_field", 5, "body.n"),
        ("unsupported_field", 6, "body.messages.0.name"),
        ("unsupported_field", 7, "body.messages.1.tool_calls"),
    ]
    assert "tools/tool_choice" in parsed.errors[0].message
    assert "'required'" in parsed.errors[1].message
    assert all(e.message.startswith(f"line {e.line}: {e.param}") for e in parsed.errors)


WEATHER_FN = {"name": "get_weather"}
WEATHER = {
    "type": "function",
    "function": {
        **WEATHER_FN,
        "description": "The weather of a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def test_tools_reach_the_request_its_key_and_the_body_sent() -> None:
    [line, plain] = parse_batch_input(
        [
            _line("t", tools=[WEATHER], tool_choice="required", parallel_tool_calls=False),
            _line("p"),
        ],
        endpoint=URL,
    ).lines
    params = line.request().params
    assert (params.tools, params.tool_choice, params.parallel_tool_calls) == (
        [WEATHER],
        "required",
        False,
    )
    body = chat_body(line.messages, max_tokens=8, temperature=0, top_p=1, extras=params.extras())
    assert (body["tools"], body["tool_choice"], body["parallel_tool_calls"]) == (
        [WEATHER],
        "required",
        False,
    )
    assert params.key_fields()["tools"] == [WEATHER]
    assert "tools" not in plain.request().params.key_fields()
    bad = parse_batch_input(
        [
            _line("choice", tool_choice="auto"),
            _line("type", tools=[{"type": "code_interpreter"}]),
            _line("name", tools=[{"type": "function", "function": {"name": "two words"}}]),
        ],
        endpoint=URL,
    )
    assert [(e.code, e.line) for e in bad.errors] == [("invalid_request", n) for n in (1, 2, 3)]
    assert bad.errors[0].param == "body.tool_choice"
    assert "only allowed with tools" in bad.errors[0].message


def test_a_completion_line_is_its_raw_prompt_with_the_fields_llama_server_applies() -> None:
    fields = {"stop": ["\n"], "seed": 3, "presence_penalty": 0.5, "logit_bias": {"7": 5}}
    lines = [
        _raw(
            "c",
            {"model": "m", "prompt": "Once upon", "logprobs": 2, "echo": False, **fields},
            COMPLETIONS,
        ),
        _raw("d", {"prompt": "x", "best_of": 1, "n": 1, "user": "u"}, COMPLETIONS),
    ]
    parsed = parse_batch_input([*lines], endpoint=COMPLETIONS)
    assert parsed.errors == []
    first, second = parsed.lines
    assert (first.kind, first.system, first.prompt, first.top_logprobs) == (
        "completion",
        "",
        "Once upon",
        2,
    )
    request = first.request()
    assert (request.kind, request.raw_prompt) == ("completion", "Once upon")
    assert (request.params.n_probs, request.params.stop, request.params.seed) == (2, ["\n"], 3)
    # OpenAI's legacy defaults: 16 tokens, temperature 1.
    assert (second.params.max_tokens, second.params.temperature) == (16, 1.0)
    body = completion_body(
        request.raw_prompt,
        max_tokens=5,
        temperature=0,
        top_p=1,
        logprobs=request.params.n_probs,
        extras=request.params.extras(),
    )
    assert (body["prompt"], body["logprobs"], body["stop"], body["logit_bias"]) == (
        "Once upon",
        2,
        ["\n"],
        {"7": 5.0},
    )
    assert "stream" not in body  # logprobs come whole; without them the answer streams


def test_a_completion_line_fails_naming_what_llama_server_would_not_apply() -> None:
    lines = [
        _raw("list", {"prompt": ["a", "b"]}, COMPLETIONS),
        _raw("tokens", {"prompt": [[1, 2, 3]]}, COMPLETIONS),
        _raw("suffix", {"prompt": "a", "suffix": "z"}, COMPLETIONS),
        _raw("echo", {"prompt": "a", "echo": True}, COMPLETIONS),
        _raw("best", {"prompt": "a", "best_of": 3}, COMPLETIONS),
        _raw("chat", {"messages": [{"role": "user", "content": "Hi."}]}, COMPLETIONS),
        _raw("tools", {"prompt": "a", "tools": [WEATHER]}, COMPLETIONS),
        _raw("many", {"prompt": "a", "logprobs": 6}, COMPLETIONS),
        _raw("empty", {"prompt": ""}, COMPLETIONS),
        _raw("url", {"prompt": "a"}),
    ]
    parsed = parse_batch_input(lines, endpoint=COMPLETIONS)
    assert [(e.code, e.param) for e in parsed.errors] == [
        ("unsupported_field", "body.prompt"),
        ("unsupported_field", "body.prompt"),
        ("unsupported_field", "body.suffix"),
        ("unsupported_field", "body.echo"),
        ("unsupported_field", "body.best_of"),
        ("unsupported_field", "body.messages"),
        ("unsupported_field", "body.tools"),
        ("invalid_request", "body.logprobs"),
        ("invalid_request", "body.prompt"),
        ("invalid_url", "url"),
    ]
    assert "one line per prompt" in parsed.errors[0].message
    assert "suffix" in parsed.errors[2].message


def test_an_unknown_model_fails_its_line_with_model_not_found() -> None:
    served = frozenset({"smollm2-135m-instruct.q4_1"})
    lines = [
        _line("served", model="SmolLM2-135M-Instruct.Q4_1"),
        _line("other", model="gpt-4o-mini"),
        json.dumps({"custom_id": "none", "method": "POST", "url": URL, "body": {
            "messages": [{"role": "user", "content": "Hi."}]}}).encode(),
    ]  # fmt: skip
    scan = scan_batch_input(io.BytesIO(b"\n".join(lines)), endpoint=URL, models=served)
    assert [(e.code, e.line, e.param) for e in scan.errors] == [
        ("model_not_found", 2, "body.model")
    ]
    assert "gpt-4o-mini" in scan.errors[0].message


def test_the_served_models_are_the_model_files_stem_and_configured_aliases(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tmp_path / "Tiny-Model.Q4.gguf"
    model.write_bytes(b"")
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KIMI_BATCH_MODEL", str(model))
    monkeypatch.setenv("KIMI_BATCH_LLAMA_EXTRA_ARGS", "--alias tiny")
    monkeypatch.delenv("KIMI_BATCH_LLAMA_URL", raising=False)
    assert served_models(Settings.from_env()) == {"tiny-model.q4", "tiny-model.q4.gguf", "tiny"}
    # llama-server's short spelling, and its comma-separated list of aliases.
    monkeypatch.setenv("KIMI_BATCH_LLAMA_EXTRA_ARGS", "-a kimi,Kimi-K2.5 --alias tiny")
    assert served_models(Settings.from_env()) == {
        "tiny-model.q4",
        "tiny-model.q4.gguf",
        "kimi",
        "kimi-k2.5",
        "tiny",
    }
    # An attached server's name is known only to it: any name passes validation.
    monkeypatch.setenv("KIMI_BATCH_LLAMA_URL", "http://127.0.0.1:9")
    assert served_models(Settings.from_env()) is None


def test_the_sampling_fields_reach_the_request_and_the_body_sent() -> None:
    fields = {
        "stop": "END",
        "presence_penalty": 0.5,
        "frequency_penalty": -0.25,
        "logit_bias": {"42": -100},
        "seed": 7,
        "temperature": 0.3,
    }
    [line] = parse_batch_input([_line("a", **fields)], endpoint=URL).lines
    params = line.request().params
    assert (params.stop, params.presence_penalty, params.frequency_penalty) == (["END"], 0.5, -0.25)
    assert (params.logit_bias, params.seed) == ({"42": -100.0}, 7)
    body = chat_body(
        line.messages,
        max_tokens=params.max_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        seed=params.seed,
        extras=params.extras(),
    )
    assert {name: body[name] for name in fields} == {**fields, "stop": ["END"]}


RESPONSES = "/v1/responses"


def test_a_responses_line_runs_as_the_chat_request_llama_server_would_make_of_it() -> None:
    conversation = [
        {"role": "user", "content": [{"type": "input_text", "text": "Two?"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "2"}]},
        {"type": "message", "role": "user", "content": "Three?"},
    ]
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    function = {"type": "function", "name": "count", "parameters": {"type": "object"}}
    lines = [
        _raw(
            "plain",
            {"input": "Hi.", "instructions": "Be terse.", "max_output_tokens": 9},
            RESPONSES,
        ),
        _raw(
            "turns",
            {
                "model": "m",
                "input": conversation,
                "temperature": 0,
                "text": {"format": {"type": "json_schema", "name": "n", "schema": schema}},
                "tools": [function],
                "tool_choice": "required",
                "store": False,
            },
            RESPONSES,
        ),
    ]
    parsed = parse_batch_input(lines, endpoint=RESPONSES)
    assert parsed.errors == []
    plain, turns = parsed.lines
    assert (plain.kind, plain.system, plain.prompt, plain.params.max_tokens) == (
        "responses",
        "Be terse.",
        "Hi.",
        9,
    )
    request = turns.request()
    assert request.kind == "chat"  # the same request a chat line with these turns makes
    assert [(m.role, m.content) for m in request.messages] == [
        ("user", "Two?"),
        ("assistant", "2"),
        ("user", "Three?"),
    ]
    assert request.params.json_schema == schema
    assert request.params.tools == [
        {"type": "function", "function": {"name": "count", "parameters": {"type": "object"}}}
    ]
    assert (request.params.tool_choice, request.params.temperature) == ("required", 0.0)
    chat = parse_batch_input(
        [_raw("plain", {"messages": [{"role": "user", "content": "Three?"}]})], endpoint=URL
    ).lines[0]
    assert chat.request().messages[-1] == request.messages[-1]


def test_a_responses_line_fails_naming_what_is_not_served() -> None:
    lines = [
        _raw("chained", {"input": "a", "previous_response_id": "resp_1"}, RESPONSES),
        _raw("call", {"input": [{"type": "function_call_output", "call_id": "1"}]}, RESPONSES),
        _raw("search", {"input": "a", "tools": [{"type": "web_search"}]}, RESPONSES),
        _raw("reasoning", {"input": "a", "reasoning": {"effort": "low"}}, RESPONSES),
        _raw("stop", {"input": "a", "stop": ["\n"]}, RESPONSES),
        _raw("system", {"input": [{"role": "system", "content": "only"}]}, RESPONSES),
        _raw("empty", {"input": []}, RESPONSES),
        _raw(
            "image", {"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, RESPONSES
        ),
    ]
    parsed = parse_batch_input(lines, endpoint=RESPONSES)
    assert [(e.code, e.param) for e in parsed.errors] == [
        ("unsupported_field", "body.previous_response_id"),
        ("unsupported_field", "body.input.0.type"),
        ("unsupported_field", "body.tools.0.type"),
        ("unsupported_field", "body.reasoning"),
        ("unsupported_field", "body.stop"),
        ("invalid_request", "body.input"),
        ("invalid_request", "body.input"),
        ("invalid_request", "body.input.0.content"),
    ]
    assert "no response is stored here" in parsed.errors[0].message
    assert "function tools only" in parsed.errors[2].message


def test_a_number_json_does_not_allow_fails_its_line_naming_where_it_is() -> None:
    """Python's JSON reader takes NaN and Infinity (and 1e999 as infinity); the request sent in
    the run is strict JSON and could not hold them, so the line is refused here, as OpenAI's
    strict JSON refuses it, instead of the run failing the whole batch (or the value becoming
    null in a tool's parameters)."""
    schema = {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "number"}}}
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    flat = {"type": "function", "name": "f", "parameters": {"type": "number"}}
    text = {"format": {"type": "json_schema", "name": "n", "schema": {"type": "number"}}}
    chat_lines = [
        _line("ok"),
        _line("schema", response_format=schema).replace(
            b'"type": "number"', b'"type": "number", "maximum": Infinity'
        ),
        _line("tool", tools=[tool]).replace(b'"type": "object"', b'"type": "object", "x": NaN'),
        _line("low", temperature=0).replace(b'"temperature": 0', b'"temperature": -Infinity'),
        _line("huge", stop=["a"]).replace(b'"stop": ["a"]', b'"stop": ["a"], "seed": 1e999'),
    ]
    scan = scan_batch_input(io.BytesIO(b"\n".join(chat_lines)), endpoint=URL)
    assert scan.request_total == 0
    assert [(e.code, e.line, e.param) for e in scan.errors] == [
        ("invalid_json_line", 2, "body.response_format.json_schema.schema.maximum"),
        ("invalid_json_line", 3, "body.tools.0.function.parameters.x"),
        ("invalid_json_line", 4, "body.temperature"),
        ("invalid_json_line", 5, "body.seed"),
    ]
    messages = [e.message for e in scan.errors]
    assert "is Infinity" in messages[0]
    assert "is NaN" in messages[1]
    assert "is -Infinity" in messages[2]
    assert all(
        "not valid JSON" in m and m.startswith(f"line {e.line}:")
        for m, e in zip(messages, scan.errors, strict=True)
    )
    responses = [
        _raw("text", {"input": "a", "text": text}, RESPONSES).replace(
            b'"type": "number"', b'"type": "number", "minimum": -Infinity'
        ),
        _raw("tool", {"input": "a", "tools": [flat]}, RESPONSES).replace(
            b'"type": "number"', b'"type": "number", "enum": [1, NaN]'
        ),
    ]
    parsed = parse_batch_input(responses, endpoint=RESPONSES)
    assert parsed.lines == []
    assert [(e.code, e.param) for e in parsed.errors] == [
        ("invalid_json_line", "body.text.format.schema.minimum"),
        ("invalid_json_line", "body.tools.0.parameters.enum.1"),
    ]


def test_a_logit_bias_key_of_other_digits_than_ascii_fails_its_line() -> None:
    # str.isdigit takes '٣' and '²'; llama-server's strtol does not, and tokenizes such a key
    # as text instead: the bias would fall on other tokens, silently.
    lines = [_line(key, logit_bias={key: 5}) for key in ("٣", "²", "42")]
    parsed = parse_batch_input(lines, endpoint=URL)
    assert [(e.code, e.line) for e in parsed.errors] == [("invalid_request", n) for n in (1, 2)]


def test_text_parts_are_joined_a_line_apart_as_llama_server_and_the_inbox_join_them(
    tmp_path: Path,
) -> None:
    parts = [{"type": "text", "text": "What is"}, {"type": "text", "text": "2+2?"}]
    chat = _raw("chat", {"messages": [{"role": "user", "content": parts}]})
    items = [{**part, "type": "input_text"} for part in parts]
    responses = _raw("resp", {"input": [{"role": "user", "content": items}]}, RESPONSES)
    inbox = tmp_path / "rows.jsonl"
    inbox.write_text(json.dumps({"messages": [{"role": "user", "content": parts}]}) + "\n")

    (chat_parsed,) = parse_batch_input([chat], endpoint=URL).lines
    (responses_line,) = parse_batch_input([responses], endpoint=RESPONSES).lines
    (seed,) = read_inbox_file(inbox).seeds

    assert chat_parsed.request().messages[-1].content == "What is\n2+2?"
    assert responses_line.request().messages[-1].content == "What is\n2+2?"
    assert seed.prompt == "What is\n2+2?"


def test_an_integer_past_a_double_s_range_fails_its_line_naming_where_it_is() -> None:
    """JSON has integers of any size and Python reads them exactly, but llama-server reads a
    number as a 64-bit integer or a double: found only in the run, it would fail the batch."""
    tool = {"type": "function", "function": {"name": "f", "parameters": {"maximum": 10**309}}}
    lines = [_line("big", tools=[tool]), _line("ok", seed=10**18)]

    scan = scan_batch_input(io.BytesIO(b"\n".join(lines)), endpoint=URL)

    assert [(e.code, e.line, e.param) for e in scan.errors] == [
        ("invalid_json_line", 1, "body.tools.0.function.parameters.maximum")
    ]
    assert "is an integer past a double's range" in scan.errors[0].message


def test_top_logprobs_without_logprobs_fails_its_line_not_dropped() -> None:
    """OpenAI refuses it (400); running the line without logprobs would answer another request."""
    lines = [_line("alone", top_logprobs=3), _line("off", logprobs=False, top_logprobs=3)]
    lines.append(_line("on", logprobs=True, top_logprobs=3))

    parsed = parse_batch_input(lines, endpoint=URL)

    assert [(e.code, e.line, e.param) for e in parsed.errors] == [
        ("invalid_request", 1, "body.top_logprobs"),
        ("invalid_request", 2, "body.top_logprobs"),
    ]
    assert "only allowed with logprobs: true" in parsed.errors[0].message


def test_a_response_s_own_output_message_passed_back_is_a_turn_of_the_conversation() -> None:
    """OpenAI's way to go on with a conversation: the output items go back as input, with the
    `id` and `status` the output line gave them (bookkeeping, no part of the prompt)."""
    said = {
        "type": "message",
        "id": "msg_abc",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "2", "annotations": []}],
    }
    conversation = [{"role": "user", "content": "Two?"}, said, {"role": "user", "content": "3?"}]
    wrong = [{**said, "status": "done"}, {"role": "user", "content": "3?"}]

    parsed = parse_batch_input(
        [_raw("back", {"input": conversation}, RESPONSES)], endpoint=RESPONSES
    )
    refused = parse_batch_input([_raw("bad", {"input": wrong}, RESPONSES)], endpoint=RESPONSES)

    assert [(e.code, e.param) for e in refused.errors] == [
        ("invalid_request", "body.input.0.status")
    ]
    assert parsed.errors == []
    (line,) = parsed.lines
    assert [(m.role, m.content) for m in line.request().messages] == [
        ("user", "Two?"),
        ("assistant", "2"),
        ("user", "3?"),
    ]
