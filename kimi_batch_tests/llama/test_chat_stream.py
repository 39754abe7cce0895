"""Streamed chat answers: rebuilt into the non-streamed `ChatCompletion`, and a cancelled one
frees its llama-server slot at once (a non-streamed one ran to its end)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kimi_batch.llama.chat_stream import EVENT_STREAM
from kimi_batch.llama.client import LlamaClient
from kimi_batch.llama.exceptions import (
    LlamaConnectionError,
    LlamaRequestError,
    LlamaResponseError,
    LlamaServerError,
)
from kimi_batch.llama.messages import ChatMessage
from kimi_batch.llama.responses import ChatCompletion
from kimi_batch.llama.server import ResidentServer
from kimi_batch_tests.support.llama_server import make_spec

HELLO = [ChatMessage(role="user", content="Say hello in three words.")]

_TIMINGS = {
    "cache_n": 25,
    "prompt_n": 5,
    "prompt_ms": 10.0,
    "predicted_n": 3,
    "predicted_ms": 6.0,
    "draft_n": 4,
    "draft_n_accepted": 2,
}


def _top(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "top_logprobs": [{"token": "x", "logprob": -3.0}]}


def _chunk(choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    head = {"id": "chatcmpl-7", "model": "smollm2", "created": 1700000000}
    return {**head, "object": "chat.completion.chunk", "choices": choices, **extra}


def _delta(delta: dict[str, Any], *, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return _chunk([{"index": 0, "delta": delta, "finish_reason": finish, **extra}])


def _sse(*events: dict[str, Any] | str) -> bytes:
    """An event stream as llama.cpp writes it: `data: {...}` events, a raw line for the rest."""
    lines = [e if isinstance(e, str) else f"data: {json.dumps(e)}" for e in events]
    return "".join(f"{line}\n\n" for line in lines).encode()


_STREAM = _sse(
    _delta({"role": "assistant", "content": None}),
    _delta({"reasoning_content": "think "}),
    _delta({"reasoning_content": "hard"}),
    _delta({"content": "Hel"}, logprobs={"content": [_top("Hel", -0.1)]}),
    _delta({"content": "lo"}, logprobs={"content": [_top("lo", -0.2)]}),
    _delta({"content": "!"}, logprobs={"content": [_top("!", -0.3)]}),
    _delta({}, finish="length"),
    _chunk(
        [],
        usage={"prompt_tokens": 30, "completion_tokens": 3, "total_tokens": 33},
        timings=_TIMINGS,
    ),
    "data: [DONE]",
)


def _streaming(body: bytes, sent: list[dict[str, Any]] | None = None) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        if sent is not None:
            sent.append(json.loads(request.content))
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    return httpx.MockTransport(handler)


async def test_a_streamed_answer_is_rebuilt_into_one_completion() -> None:
    sent: list[dict[str, Any]] = []
    async with LlamaClient("http://llama", transport=_streaming(_STREAM, sent)) as client:
        completion = await client.chat(HELLO, max_tokens=3, top_logprobs=1)
    assert (completion.id, completion.model, completion.created) == (
        "chatcmpl-7",
        "smollm2",
        1700000000,
    )
    assert completion.text == "Hello!"
    assert completion.reasoning_content == "think hard"
    assert completion.finish_reason == "length"
    logprobs = completion.logprobs
    assert logprobs is not None
    assert [(t.token, t.logprob) for t in logprobs] == [("Hel", -0.1), ("lo", -0.2), ("!", -0.3)]
    assert all(t.top[0].token == "x" for t in logprobs)
    stats = completion.stats
    assert (stats.prompt_tokens, stats.cached_tokens, stats.completion_tokens) == (30, 25, 3)
    assert (stats.draft_tokens, stats.draft_accepted_tokens) == (4, 2)


async def test_chat_streams_unless_logprobs_are_asked() -> None:
    sent: list[dict[str, Any]] = []
    async with LlamaClient("http://llama", transport=_streaming(_STREAM, sent)) as client:
        await client.chat(HELLO, max_tokens=3)
        await client.chat(HELLO, max_tokens=3, top_logprobs=2)
    plain, with_logprobs = sent
    assert plain["stream"] is True
    assert plain["stream_options"] == {"include_usage": True}
    assert "logprobs" not in plain
    # llama-server's stream leaves out a token whose text is empty: logprobs come whole.
    assert "stream" not in with_logprobs
    assert (with_logprobs["logprobs"], with_logprobs["top_logprobs"]) == (True, 2)


async def test_a_streamed_answer_equals_the_same_answer_sent_whole() -> None:
    whole = {
        "id": "chatcmpl-7",
        "model": "smollm2",
        "created": 1700000000,
        "choices": [
            {
                "index": 0,
                "finish_reason": "length",
                "message": {
                    "role": "assistant",
                    "content": "Hello!",
                    "reasoning_content": "think hard",
                },
                "logprobs": {"content": [_top("Hel", -0.1), _top("lo", -0.2), _top("!", -0.3)]},
            }
        ],
        "usage": {"prompt_tokens": 30, "completion_tokens": 3, "total_tokens": 33},
        "timings": _TIMINGS,
    }
    async with LlamaClient("http://llama", transport=_streaming(_STREAM)) as client:
        streamed = await client.chat(HELLO, max_tokens=3, top_logprobs=1)
    assert streamed == ChatCompletion.model_validate(whole)


async def test_an_error_event_inside_the_stream_is_the_typed_error() -> None:
    started = _sse(_delta({"content": "Hel"}))
    server_side = started + b'error: {"error": {"code": 500, "message": "kv cache full"}}\n\n'
    request_side = started + _sse({"error": {"code": 400, "message": "bad grammar"}})
    async with LlamaClient("http://llama", transport=_streaming(server_side)) as client:
        with pytest.raises(LlamaServerError, match="kv cache full"):
            await client.chat(HELLO, max_tokens=3)
    async with LlamaClient("http://llama", transport=_streaming(request_side)) as client:
        with pytest.raises(LlamaRequestError, match="bad grammar"):
            await client.chat(HELLO, max_tokens=3)


async def test_a_lone_surrogate_in_a_streamed_answer_is_a_response_error() -> None:
    """As in an answer sent whole: the ledger could not store the text (its UTF-8 write raised
    out of the engine and ended the whole batch, on every rerun of a seeded request)."""
    broken = _sse(_delta({"content": "hi \ud83d"}), _delta({}, finish="stop"), "data: [DONE]")
    async with LlamaClient("http://llama", transport=_streaming(broken)) as client:
        with pytest.raises(LlamaResponseError, match="not valid Unicode"):
            await client.chat(HELLO, max_tokens=3)
    upper = broken.replace(b"\\ud83d", b"\\uD83D")  # JSON's hex digits are either case
    assert upper != broken
    async with LlamaClient("http://llama", transport=_streaming(upper)) as client:
        with pytest.raises(LlamaResponseError, match="not valid Unicode"):
            await client.chat(HELLO, max_tokens=3)
    paired = _sse(_delta({"content": "hi \U0001f600"}), _delta({}, finish="stop"), "data: [DONE]")
    async with LlamaClient("http://llama", transport=_streaming(paired)) as client:
        assert (await client.chat(HELLO, max_tokens=3)).text == "hi \U0001f600"


async def test_a_stream_cut_before_the_answer_ended_is_a_connection_error() -> None:
    cut = _sse(_delta({"content": "Hel"}), _delta({"content": "lo"}))
    async with LlamaClient("http://llama", transport=_streaming(cut)) as client:
        with pytest.raises(LlamaConnectionError, match="stream ended"):
            await client.chat(HELLO, max_tokens=3)


async def test_an_error_status_before_the_stream_keeps_its_typed_error() -> None:
    refused = httpx.Response(400, json={"error": {"code": 400, "message": "context exceeded"}})
    transport = httpx.MockTransport(lambda request: refused)
    async with LlamaClient("http://llama", transport=transport) as client:
        with pytest.raises(LlamaRequestError, match="context exceeded"):
            await client.chat(HELLO, max_tokens=3)


def _call(index: int, **fields: Any) -> dict[str, Any]:
    return {"tool_calls": [{"index": index, **fields}]}


# A tool-calling answer as llama.cpp streams it (server_chat_msg_diff_to_json_oaicompat): a call's
# first delta names it, the next ones carry more of its arguments under the same index.
_TOOL_STREAM = _sse(
    _delta({"role": "assistant", "content": None}),
    _delta(_call(0, id="call_a", type="function", function={"name": "get_weather"})),
    _delta(_call(0, function={"arguments": '{"city":'})),
    _delta(_call(0, function={"arguments": ' "Paris"}'})),
    _delta(_call(1, id="call_b", type="function", function={"name": "get_time"})),
    _delta(_call(1, function={"arguments": "{}"})),
    _delta({}, finish="tool_calls"),
    _chunk([], usage={"prompt_tokens": 90, "completion_tokens": 20, "total_tokens": 110}),
    "data: [DONE]",
)


async def test_a_streamed_answer_s_tool_calls_are_rebuilt_from_their_deltas() -> None:
    async with LlamaClient("http://llama", transport=_streaming(_TOOL_STREAM)) as client:
        completion = await client.chat(HELLO, max_tokens=40)
    assert completion.finish_reason == "tool_calls"
    assert completion.text == ""
    calls = completion.tool_calls
    assert calls is not None
    assert [(c.id, c.type, c.function.name, c.function.arguments) for c in calls] == [
        ("call_a", "function", "get_weather", '{"city": "Paris"}'),
        ("call_b", "function", "get_time", "{}"),
    ]


def _text_chunk(text: str, *, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": finish}
    return {"id": "chatcmpl-9", "model": "smollm2", "object": "text_completion",
            "choices": [choice], **extra}  # fmt: skip


async def test_a_text_completion_streams_unless_logprobs_are_asked_and_reads_alike() -> None:
    """`/v1/completions` answers (llama.cpp: `choices[0].text`) come back as the chat answer
    the engine records; with logprobs the body is whole and the logprobs are the chat shape."""
    stream = _sse(
        _text_chunk(" Paris"),
        _text_chunk(","),
        _text_chunk("", finish="length", usage={"prompt_tokens": 6, "completion_tokens": 2,
                    "total_tokens": 8}, timings=_TIMINGS),
        "data: [DONE]",
    )  # fmt: skip
    whole = _text_chunk(" Paris,", finish="length", usage={"prompt_tokens": 6,
                        "completion_tokens": 2, "total_tokens": 8}, timings=_TIMINGS)  # fmt: skip
    whole["choices"][0]["logprobs"] = {"content": [_top(" Paris", -0.1), _top(",", -0.2)]}
    sent: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        sent.append({"path": request.url.path, **body})
        if body.get("stream"):
            return httpx.Response(200, headers={"content-type": EVENT_STREAM}, content=stream)
        return httpx.Response(200, json=whole)

    async with LlamaClient("http://llama", transport=httpx.MockTransport(handler)) as client:
        streamed = await client.text_completion("The capital of France is", max_tokens=2)
        with_logprobs = await client.text_completion("The capital", max_tokens=2, logprobs=1)
    assert [s["path"] for s in sent] == ["/v1/completions"] * 2
    assert sent[0]["prompt"] == "The capital of France is"
    assert "messages" not in sent[0]
    assert (sent[0]["stream"], sent[1]["logprobs"]) == (True, 1)
    for answer in (streamed, with_logprobs):
        assert (answer.text, answer.finish_reason) == (" Paris,", "length")
        assert (answer.stats.prompt_tokens, answer.stats.cached_tokens) == (30, 25)
    assert [t.token for t in with_logprobs.logprobs or []] == [" Paris", ","]


# ---- the real llama-server ------------------------------------------------------------------


def _raw_body(**fields: Any) -> dict[str, Any]:
    return {"messages": [m.model_dump() for m in HELLO], "cache_prompt": True, **fields}


@pytest.mark.slow
async def test_streamed_and_non_streamed_answers_agree_on_the_real_server(
    shared_server: ResidentServer,
) -> None:
    sampling: dict[str, Any] = {"max_tokens": 12, "temperature": 0.0, "top_p": 0.95, "seed": 3}
    async with shared_server.client() as client:
        # The three compared answers all start from the prompt cached by this first one: an
        # answer from a fresh prompt evaluation may differ in a near-tie (llama.cpp's sums
        # depend on the batch shape), which is not what streaming is compared on.
        await client.chat(HELLO, slot_id=0, **sampling)
        streamed = await client.chat(HELLO, slot_id=0, **sampling)
        with_logprobs = await client.chat(HELLO, slot_id=0, top_logprobs=2, **sampling)
        async with httpx.AsyncClient(base_url=client.base_url, timeout=120) as http:
            response = await http.post(
                "/v1/chat/completions",
                json=_raw_body(**sampling, id_slot=0, logprobs=True, top_logprobs=2, stream=False),
            )
    response.raise_for_status()
    whole = ChatCompletion.model_validate_json(response.content)
    assert streamed.text
    assert streamed.text == whole.text == with_logprobs.text
    assert streamed.finish_reason == whole.finish_reason
    assert streamed.reasoning_content == whole.reasoning_content
    assert streamed.model == whole.model
    assert streamed.id.startswith("chatcmpl")
    assert streamed.usage is not None
    assert whole.usage is not None
    assert streamed.usage.prompt_tokens == whole.usage.prompt_tokens
    assert streamed.usage.completion_tokens == whole.usage.completion_tokens
    assert (whole.usage.prompt_tokens or 0) > 0
    assert (whole.usage.completion_tokens or 0) > 0
    assert streamed.usage.total_tokens == whole.usage.total_tokens
    assert streamed.timings is not None
    assert whole.timings is not None
    assert streamed.timings.predicted_n == whole.timings.predicted_n
    assert streamed.timings.prompt_n > 0
    assert streamed.stats.prompt_tokens == whole.stats.prompt_tokens
    assert streamed.stats.completion_tokens == whole.stats.completion_tokens
    # A request with logprobs is sent whole: one entry per completion token, as the server
    # computes them (its stream would leave out a token whose text is empty).
    mine_tokens, whole_tokens = with_logprobs.logprobs, whole.logprobs
    assert mine_tokens is not None
    assert whole_tokens is not None
    assert len(mine_tokens) == with_logprobs.stats.completion_tokens
    for mine, theirs in zip(mine_tokens, whole_tokens, strict=True):
        assert mine.token == theirs.token
        assert mine.logprob == pytest.approx(theirs.logprob, abs=1e-2)
        assert mine.top[0].token == theirs.top[0].token == mine.token  # greedy


@pytest.mark.slow
async def test_a_json_schema_answer_streams_as_valid_json(shared_server: ResidentServer) -> None:
    schema = {
        "type": "object",
        "properties": {"greeting": {"type": "string", "maxLength": 20}},
        "required": ["greeting"],
    }
    async with shared_server.client() as client:
        completion = await client.chat(HELLO, max_tokens=40, temperature=0.0, json_schema=schema)
    assert completion.finish_reason == "stop"
    assert isinstance(json.loads(completion.text)["greeting"], str)


# A long greedy answer: the request is still generating when it is cancelled.
STORY = [ChatMessage(role="user", content="Write a very long story about a dragon and a king.")]
LONG_ANSWER = 3000
IDLE_BOUND_S = 10.0  # generous: this machine is shared and noisy; the measured figure is ~0.1 s


@pytest.fixture
def long_server(tmp_path: Path, llama_binary: Path, model_path: Path) -> Iterator[ResidentServer]:
    """One slot that may generate a long answer (the shared server caps answers at 256)."""
    spec = make_spec(
        llama_binary, model_path, tmp_path, parallel=1, ctx=4096, n_predict=LONG_ANSWER
    )
    server = ResidentServer(spec, tmp_path / "server", load_timeout_s=300)
    server.ensure_running()
    yield server
    server.stop()


@pytest.mark.slow
async def test_cancelling_a_chat_frees_its_slot_at_once(long_server: ResidentServer) -> None:
    async with long_server.client() as client:
        chat = asyncio.create_task(
            client.chat(STORY, max_tokens=LONG_ANSWER, temperature=0.0, slot_id=0)
        )
        while not any(s.is_processing and s.n_decoded >= 20 for s in await client.slots()):
            assert not chat.done(), "the answer ended before it could be cancelled"
            await asyncio.sleep(0.05)
        chat.cancel()
        cancelled = time.monotonic()
        with pytest.raises(asyncio.CancelledError):
            await chat
        while any(s.is_processing for s in await client.slots()):
            assert time.monotonic() - cancelled < IDLE_BOUND_S, "the slot kept generating"
            await asyncio.sleep(0.05)
        idle_s = time.monotonic() - cancelled
        print(f"cancel -> idle slot: {idle_s:.2f} s")
        # The slot serves the next request: nothing of the cancelled one is left running.
        after = await client.chat(HELLO, max_tokens=4, temperature=0.0, slot_id=0)
    assert after.text
