"""A Batch API line runs on the real server as it was given (issue 27, item 5): its `stop` ends
the answer where the same line without it runs on; a `/v1/completions` line is its raw prompt,
answered as a `text_completion`; a `/v1/responses` line is answered as the server's own route
answers it, as a `response` object; a line's tools reach the chat template and the answer's tool
calls reach the output line and the `distilled` row."""

from __future__ import annotations

import json
from typing import Any, NamedTuple

import dagster as dg
import httpx
import pytest
from openai.types.responses import Response

from kimi_batch.batch_api import ApiStore, BatchStatus
from kimi_batch.pipeline import DistilledRow
from kimi_batch.settings import Settings
from kimi_batch.warehouse import Warehouse
from kimi_batch_tests.support.batches import answered, landed_batch
from kimi_batch_tests.support.llama_server import LlamaEnv

pytestmark = pytest.mark.slow  # answers a batch on a real llama-server

_COUNT = "Count from 1 to 10, separated by commas. Reply with the numbers only."
_CHAT = "/v1/chat/completions"
_RESPONSES = "/v1/responses"


def _line(custom_id: str, url: str = _CHAT, **body: Any) -> bytes:
    budget = {"max_output_tokens" if url == _RESPONSES else "max_tokens": 40}
    request = {**budget, "temperature": 0, **body}
    if url == _CHAT:
        request.setdefault("messages", [{"role": "user", "content": _COUNT}])
    line = {"custom_id": custom_id, "method": "POST", "url": url}
    return json.dumps({**line, "body": request}).encode() + b"\n"


class _Answered(NamedTuple):
    """A one-line batch once run: its output line's body or its error line, and its row."""

    body: dict[str, Any] | None
    error: dict[str, Any] | None
    row: DistilledRow | None


def _file_line(store: ApiStore, file_id: str | None) -> dict[str, Any] | None:
    record = store.file(file_id) if file_id is not None else None
    if record is None:
        return None
    [line] = store.blob_path(record).read_text().splitlines()
    return json.loads(line)


def _run(
    settings: Settings, instance: dg.DagsterInstance, data: bytes, endpoint: str = _CHAT
) -> _Answered:
    """Land and run a one-line batch of `data` through `api_batch_responses`."""
    batch = landed_batch(settings, data, filename="fields.jsonl", endpoint=endpoint)
    assert batch.request_total == 1, batch.errors
    answered(settings, instance, batch)
    with ApiStore(settings.paths) as store:
        record = store.batch(batch.id)
        assert record is not None
        assert record.status == BatchStatus.COMPLETED
        output = _file_line(store, record.output_file_id)
        error = _file_line(store, record.error_file_id)
    assert batch.ds is not None
    assert batch.source is not None
    rows = Warehouse(settings.paths.warehouse_dir).read_partition(
        "distilled", batch.ds, batch.source
    )
    # The partition's ds and source are its path, not row fields.
    rows = rows.drop("ds", "source", strict=False)
    row = DistilledRow.model_validate(rows.row(0, named=True)) if rows.height else None
    return _Answered(output["response"]["body"] if output else None, error, row)


def _answer(settings: Settings, instance: dg.DagsterInstance, data: bytes) -> dict[str, Any]:
    """The first choice of a one-line batch's output line."""
    body = _run(settings, instance, data).body
    assert body is not None
    return body["choices"][0]


def test_a_lines_stop_string_ends_its_answer_on_the_server(llama_env: LlamaEnv) -> None:
    del llama_env  # the server and the state dir the resources find
    settings = Settings.from_env()
    with dg.instance_for_test() as instance:
        free = _answer(settings, instance, _line("free"))
        text = free["message"]["content"]
        # A stop string the greedy answer holds past its start: the stopped answer must end
        # before it (on the server: nothing here trims an answer).
        words = [w for w in text.split() if text.index(w) > 0]
        assert words, f"the answer is too short to stop inside: {text!r}"
        stop = words[len(words) // 2]
        stopped = _answer(settings, instance, _line("stopped", stop=[stop]))
    assert stopped["finish_reason"] == "stop"
    assert stop not in stopped["message"]["content"]
    assert text.startswith(stopped["message"]["content"].rstrip())
    assert len(stopped["message"]["content"]) < len(text)


_PROMPT = "The three primary colors are red,"


def test_a_completions_line_is_its_raw_prompt_answered_as_a_text_completion(
    llama_env: LlamaEnv,
) -> None:
    settings = Settings.from_env()
    # Ends at the sentence's end: an answer cut at max_tokens would be no `distilled` row.
    sampling = {"max_tokens": 24, "temperature": 0, "stop": ["."]}
    # The server's own answer to the raw prompt: no chat template, nothing in front of it.
    direct = httpx.post(
        f"{llama_env.base_url}/v1/completions", json={"prompt": _PROMPT, **sampling}, timeout=120
    )
    direct.raise_for_status()
    [direct_choice] = direct.json()["choices"]
    assert direct_choice["finish_reason"] == "stop", direct_choice
    expected = direct_choice["text"]
    line = _line("p", "/v1/completions", prompt=_PROMPT, **sampling)
    with dg.instance_for_test() as instance:
        body, _, row = _run(settings, instance, line, endpoint="/v1/completions")
    assert body is not None
    assert body["object"] == "text_completion"
    [choice] = body["choices"]
    assert expected.strip()
    assert choice["text"] == expected
    assert choice["finish_reason"] == "stop"
    assert body["usage"]["prompt_tokens"] > 0
    assert body["usage"]["completion_tokens"] > 0
    assert row is not None
    assert (row.prompt, row.response, row.input_id) == (_PROMPT, expected.strip(), "p")
    assert row.prompt_tokens == body["usage"]["prompt_tokens"]


_WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather of a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


_WEATHER_LINE = _line(
    "t",
    messages=[{"role": "user", "content": "What is the weather in Paris?"}],
    max_tokens=60,
    tools=[_WEATHER],
    tool_choice="required",
)


def test_tools_the_served_template_cannot_render_fail_their_line_unsent(
    llama_env: LlamaEnv,
) -> None:
    """SmolLM2's chat template renders no tools: llama-server would answer as if none were
    given, so the line fails with the reason instead."""
    del llama_env
    settings = Settings.from_env()
    with dg.instance_for_test() as instance:
        body, error, row = _run(settings, instance, _WEATHER_LINE)
    assert (body, row) == (None, None)
    assert error is not None
    assert error["error"]["code"] == "request_failed"
    assert "does not render tools" in error["error"]["message"]


def test_a_lines_tools_reach_the_chat_template_of_a_server_that_renders_them(
    tool_server: Settings,
) -> None:
    """The server writes the line's tools into the prompt: its prompt is longer than the same
    line's without them by the tools block. (This llama.cpp build finds no tool-call format in
    this template, so it neither enforces `required` nor parses calls here; the output line of
    an answer with calls is tested server-free.)"""
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    plain = _line("plain", messages=question, max_tokens=4)
    tools = _line("tools", messages=question, max_tokens=4, tools=[_WEATHER], tool_choice="auto")
    with dg.instance_for_test() as instance:
        without, with_tools = (_run(tool_server, instance, line).body for line in (plain, tools))
    assert without is not None
    assert with_tools is not None
    grown = with_tools["usage"]["prompt_tokens"] - without["usage"]["prompt_tokens"]
    assert grown > 80, (with_tools["usage"], without["usage"])


def test_a_responses_line_is_answered_as_the_servers_own_responses_route_answers_it(
    llama_env: LlamaEnv,
) -> None:
    """A /v1/responses line runs as the chat request llama-server's route makes of it: at
    temperature 0 the same text, as a `response` object, landed as a row."""
    settings = Settings.from_env()
    request = {
        "instructions": "Answer in one short sentence.",
        "input": "What color is the sky on a clear day?",
        "max_output_tokens": 32,
        "temperature": 0,
    }
    direct = httpx.post(f"{llama_env.base_url}/v1/responses", json=request, timeout=120)
    direct.raise_for_status()
    # Read as JSON: this build's own response object lacks fields the SDK's model requires.
    expected = "".join(
        part["text"]
        for item in direct.json()["output"]
        if item["type"] == "message"
        for part in item["content"]
        if part["type"] == "output_text"
    )
    with dg.instance_for_test() as instance:
        body, _, row = _run(settings, instance, _line("r", _RESPONSES, **request), _RESPONSES)
    assert body is not None
    response = Response.model_validate(body)
    assert expected.strip()
    # The same prompt, token for token: the route's translation and ours render alike.
    assert response.usage is not None
    assert response.usage.input_tokens == direct.json()["usage"]["input_tokens"]
    assert response.usage.output_tokens > 0
    # The same answer: at temperature 0 llama.cpp is deterministic only for the same batch
    # shape and cache state (a prefix reused from a slot can round otherwise a few tokens in;
    # seen once in CI after 34 equal characters), so the answers must agree on their opening.
    assert len(expected) >= 24
    assert response.output_text[:24] == expected[:24]
    assert row is not None
    assert (row.prompt, row.input_id) == (request["input"], "r")
    assert row.response == response.output_text.strip()
