"""Hostile-input properties of the Batch API validator (issue 42): every line of a batch input,
chat or Responses, is either a request, whose text is the text sent, or one line error naming
why; a line meant to be refused (an integer past 64 bits, a nested field this server would not
apply, U+0000 in its custom_id, nesting past the bound) is never run."""

from __future__ import annotations

import io
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kimi_batch.batch_api.lines import MAX_NESTING, BatchValidator
from kimi_batch.inputs.formats import jsonl_items

EXAMPLES = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
INT64_MAX = (1 << 63) - 1
_ODD = (
    "日本語の質問中文问题Русский вопросعربيעבריתहिन्दी😀👩‍👩‍👧é\u0301"
    "\x00\x01\x1b\x7f\x85\u2028\u2029\u200b\ufeff\t\r\n \"',\\{}[]"
)
TEXT = st.text(st.one_of(st.characters(codec="utf-8"), st.sampled_from(_ODD)), max_size=30)
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}}

# What makes a line refused, each on its own; None: a line that must run.
FLAWS = st.sampled_from(
    [
        None,
        None,
        "seed_past_64_bits",
        "max_tokens_past_64_bits",
        "nul_in_custom_id",
        "unknown_nested_field",
        "too_deep",
        "misplaced_schema",
    ]
)


def _deep(levels: int) -> dict[str, Any]:
    node: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        node = {"type": "object", "properties": {"a": node}}
    return node


def _body(kind: str, text: str, flaw: str | None, number: int) -> dict[str, Any]:
    if kind == CHAT:
        body: dict[str, Any] = {"messages": [{"role": "user", "content": text}]}
        schema_at = body.setdefault("response_format", {"type": "json_schema"})
        schema_at["json_schema"] = {"name": "n", "schema": SCHEMA}
    else:
        parts = [{"type": "input_text", "text": text}]
        body = {"input": text if number % 2 else [{"role": "user", "content": parts}]}
        body["text"] = {"format": {"type": "json_schema", "name": "n", "schema": SCHEMA}}
    # A valid integer everywhere but where a flaw says otherwise (Responses take no seed).
    body["seed" if kind == CHAT else "max_output_tokens"] = number + 1
    if flaw == "seed_past_64_bits":
        body["seed"] = INT64_MAX + 1 + number
    elif flaw == "max_tokens_past_64_bits":
        body["max_output_tokens" if kind == RESPONSES else "max_tokens"] = 1 << (64 + number % 9)
    elif flaw == "unknown_nested_field":
        nested: dict[str, Any] = body["response_format"] if kind == CHAT else body["text"]
        nested["verbosity" if number % 2 else "fromat"] = "low"
    elif flaw == "too_deep":
        deep = _deep(MAX_NESTING)
        if kind == CHAT:
            body["response_format"]["json_schema"]["schema"] = deep
        else:
            body["text"]["format"]["schema"] = deep
    elif flaw == "misplaced_schema":
        if kind == CHAT:
            body["response_format"] = {"type": "json_object", "schema": SCHEMA}
        else:
            body["text"] = {"format": {"type": "json_object", "schema": SCHEMA}}
    return body


@st.composite
def _lines(draw: st.DrawFn) -> tuple[str, list[tuple[str, str | None, bytes]]]:
    kind = draw(st.sampled_from([CHAT, RESPONSES]))
    lines = []
    for number in range(draw(st.integers(1, 8))):
        text, flaw = draw(TEXT), draw(FLAWS)
        own = draw(TEXT).replace("\x00", "")
        custom_id = f"{number}-{own}" + ("\x00" if flaw == "nul_in_custom_id" else "")
        line = {
            "custom_id": custom_id,
            "method": "POST",
            "url": kind,
            "body": _body(kind, text, flaw, number),
        }
        raw = json.dumps(line, ensure_ascii=draw(st.booleans())).encode()
        lines.append((text, flaw, raw))
    return kind, lines


@EXAMPLES
@given(batch=_lines())
def test_every_line_is_a_request_with_its_text_or_one_error(
    batch: tuple[str, list[tuple[str, str | None, bytes]]],
) -> None:
    kind, lines = batch
    validator = BatchValidator(endpoint=kind)
    items = list(jsonl_items(io.BytesIO(b"\n".join(raw for _, _, raw in lines) + b"\n")))
    assert len(items) == len(lines)

    for (text, flaw, _), item in zip(lines, items, strict=True):
        errors = validator.error_count
        request = validator.check(item)
        if flaw is None:
            assert request is not None, validator.errors[-1]
            assert validator.error_count == errors
            # The text sent is the text written, whole (a Responses string is one user turn).
            assert [m.content for m in request.messages] == [text]
            assert request.params.json_schema == SCHEMA
        else:
            assert request is None, flaw
            assert validator.error_count == errors + 1
            assert validator.errors[-1].message.startswith(f"line {item.line}: ")
    scan = validator.finish()
    flawed = sum(flaw is not None for _, flaw, _ in lines)
    assert scan.error_count == flawed
    assert scan.request_total == (len(lines) if not flawed else 0)
