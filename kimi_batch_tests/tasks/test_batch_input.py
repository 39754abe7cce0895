"""A Batch API input validated as it streams: every line-level failure is that line's error."""

from __future__ import annotations

import io
import json

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
