"""A line's request as the real llama-server takes it: what validation accepts is the prompt the
server would render from the body as written, and what it refuses the server refuses too."""

from __future__ import annotations

import io
import json

import httpx
import pytest

from kimi_batch.batch_api.lines import parse_batch_input, scan_batch_input
from kimi_batch.llama import ResidentServer

pytestmark = pytest.mark.slow  # the real llama-server

CHAT = "/v1/chat/completions"


def _line(custom_id: str, body: dict[str, object]) -> bytes:
    return json.dumps(
        {"custom_id": custom_id, "method": "POST", "url": CHAT, "body": body}
    ).encode()


async def test_text_parts_render_as_the_server_renders_the_parts_themselves(
    shared_server: ResidentServer,
) -> None:
    parts = [{"type": "text", "text": "What is"}, {"type": "text", "text": "2+2?"}]
    messages = [{"role": "user", "content": parts}]
    (line,) = parse_batch_input([_line("parts", {"messages": messages})], endpoint=CHAT).lines

    async with shared_server.client() as client:
        ours = await client.apply_template(line.request().messages)
    async with httpx.AsyncClient(base_url=shared_server.base_url) as raw:
        response = await raw.post("/apply-template", json={"messages": messages})

    assert ours == response.json()["prompt"]
    assert "What is\n2+2?" in ours


async def test_an_integer_past_a_double_s_range_is_refused_as_the_server_refuses_it(
    shared_server: ResidentServer,
) -> None:
    def body(maximum: int) -> dict[str, object]:
        function = {"name": "f", "parameters": {"type": "object", "maximum": maximum}}
        messages = [{"role": "user", "content": "Hi."}]
        return {
            "messages": messages,
            "max_tokens": 1,
            "tools": [{"type": "function", "function": function}],
        }

    past_scan = scan_batch_input(io.BytesIO(_line("past", body(10**309))), endpoint=CHAT)
    within_scan = scan_batch_input(io.BytesIO(_line("within", body(10**300))), endpoint=CHAT)
    async with httpx.AsyncClient(base_url=shared_server.base_url, timeout=120) as raw:
        past = await raw.post(CHAT, content=json.dumps(body(10**309)))
        within = await raw.post(CHAT, content=json.dumps(body(10**300)))

    assert [error.code for error in past_scan.errors] == ["invalid_json_line"]
    assert (within_scan.errors, within_scan.request_total) == ([], 1)
    assert past.status_code == 400
    assert "number overflow" in past.json()["error"]["message"]
    assert within.status_code == 200
