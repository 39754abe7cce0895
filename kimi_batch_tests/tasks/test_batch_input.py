"""A Batch API input validated as it streams: every line-level failure is that line's error."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from kimi_batch.llama import chat_body
from kimi_batch.settings import Settings
from kimi_batch.tasks.batch_fields import served_models
from kimi_batch.tasks.batch_input import MAX_NESTING, parse_batch_input, scan_batch_input
from kimi_batch_tests.support.batches import chat_line

URL = "/v1/chat/completions"


def _line(custom_id: str, content: str = "Hi.", **body: object) -> bytes:
    return json.dumps(chat_line(custom_id, content, **body)).encode()


def test_lines_that_break_the_json_parser_or_the_models_are_line_errors() -> None:
    deep = b'{"custom_id": "deep", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    huge = b'{"custom_id": "huge", "n": ' + b"9" * 5000 + b"}"
    nested = _line("nested", response_format={"type": "json_schema", "json_schema": {}})
    nested = nested.replace(
        b'"json_schema": {}', b'"json_schema": ' + b'{"a": ' * 100 + b"1" + b"}" * 100
    )
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


def test_a_field_the_server_would_not_apply_fails_its_line_naming_the_field() -> None:
    """A batch runs the request it was given or none: nothing is dropped silently."""
    lines = [
        _line("ok", stop=["\n"], user="u1", metadata={"k": "v"}),
        _line("tools", tools=[{"type": "function", "function": {"name": "f"}}]),
        _line("choice", tool_choice="auto"),
        _line("unknown", reasoning_effort="high"),
        _line("two", n=2),
        json.dumps(
            {
                "custom_id": "named",
                "method": "POST",
                "url": URL,
                "body": {"messages": [{"role": "user", "content": "Hi.", "name": "ann"}]},
            }
        ).encode(),
    ]
    parsed = parse_batch_input(lines, endpoint=URL)
    assert [(e.code, e.line, e.param) for e in parsed.errors] == [
        ("unsupported_field", 2, "body.tools"),
        ("unsupported_field", 3, "body.tool_choice"),
        ("unsupported_field", 4, "body.reasoning_effort"),
        ("unsupported_field", 5, "body.n"),
        ("unsupported_field", 6, "body.messages.0.name"),
    ]
    assert "tool calls" in parsed.errors[0].message
    assert all(e.message.startswith(f"line {e.line}: {e.param}") for e in parsed.errors)


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
