"""Nested request fields: each is passed through to the request that runs, or refused with a line
error naming it, never dropped (issue 42, item 14)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kimi_batch.batch_api.lines import BatchInput, parse_batch_input

CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
HI = [{"role": "user", "content": "Hi."}]


def _parse(url: str, body: dict[str, Any]) -> BatchInput:
    line = {"custom_id": "a", "method": "POST", "url": url, "body": body}
    return parse_batch_input([json.dumps(line).encode()], endpoint=url)


@pytest.mark.parametrize(
    ("url", "body", "param"),
    [
        (RESPONSES, {"input": "Hi.", "text": {"verbosity": "low"}}, "body.text.verbosity"),
        (
            RESPONSES,
            {"input": "Hi.", "text": {"fromat": {"type": "json_object"}}},
            "body.text.fromat",
        ),
        (
            RESPONSES,
            {"input": "Hi.", "text": {"format": {"type": "json_schema", "schema": SCHEMA, "x": 1}}},
            "body.text.format.x",
        ),
        (
            RESPONSES,
            {"input": "Hi.", "text": {"format": {"type": "text", "schema": SCHEMA}}},
            "body.text.format.schema",
        ),
        (
            CHAT,
            {"messages": HI, "response_format": {"type": "json_object", "schema": SCHEMA}},
            "body.response_format.schema",
        ),
        (
            CHAT,
            {
                "messages": HI,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "n", "schema": SCHEMA, "verbose": True},
                },
            },
            "body.response_format.json_schema.verbose",
        ),
        (
            CHAT,
            {
                "messages": HI,
                "response_format": {"type": "text", "json_schema": {"schema": SCHEMA}},
            },
            "body.response_format.json_schema",
        ),
        (
            CHAT,
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi", "x": 1}]}]},
            "body.messages.0.content",
        ),
    ],
)
def test_a_nested_field_not_applied_is_a_line_error_naming_it(
    url: str, body: dict[str, Any], param: str
) -> None:
    parsed = _parse(url, body)

    assert parsed.lines == []
    [error] = parsed.errors
    assert error.param == param
    assert error.message.startswith("line 1: ")
    assert param.removeprefix("body.").split(".")[-1] in error.message


def test_nested_fields_that_are_applied_reach_the_request() -> None:
    chat = _parse(
        CHAT,
        {
            "messages": HI,
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": "n",
                    "description": "a number",
                    "schema": SCHEMA,
                    "strict": True,
                },
            },
        },
    )
    responses = _parse(
        RESPONSES,
        {
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "Hi."}]}],
            "text": {
                "format": {"type": "json_schema", "name": "n", "schema": SCHEMA, "strict": True}
            },
        },
    )

    assert chat.errors == []
    assert responses.errors == []
    assert chat.lines[0].params.json_schema == SCHEMA
    assert responses.lines[0].params.json_schema == SCHEMA
    assert responses.lines[0].messages[0].content == "Hi."


def test_a_custom_id_holding_nul_is_a_line_error() -> None:
    line = {"custom_id": "a\x00b", "method": "POST", "url": CHAT, "body": {"messages": HI}}

    parsed = parse_batch_input([json.dumps(line).encode()], endpoint=CHAT)

    assert parsed.lines == []
    [error] = parsed.errors
    assert (error.code, error.param) == ("invalid_request", "custom_id")
    assert "must not contain U+0000" in error.message
