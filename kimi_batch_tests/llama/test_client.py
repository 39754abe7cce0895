"""The typed client against the real llama-server, plus what a real server cannot do on demand."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
from collections.abc import AsyncIterator, Callable

import httpx
import pytest

from kimi_batch.llama.client import LlamaClient, RetryPolicy
from kimi_batch.llama.exceptions import (
    LlamaBodyError,
    LlamaBodyTooLargeError,
    LlamaConnectionError,
    LlamaFeatureError,
    LlamaLoadingError,
    LlamaRequestError,
    LlamaResponseError,
    LlamaTimeoutError,
)
from kimi_batch.llama.messages import ChatExtras, ChatMessage
from kimi_batch.llama.responses import ChatCompletion
from kimi_batch.llama.server import ResidentServer
from kimi_batch.llama.server_state import HealthState, SlotState
from kimi_batch_tests.support.llama_server import TEST_SLOTS
from kimi_batch_tests.support.ports import free_port
from kimi_batch_tests.support.results import chat_body

FAST_RETRY = RetryPolicy(attempts=3, backoff_s=0.01, max_backoff_s=0.02)
HELLO = [ChatMessage(role="user", content="Say hello in one word.")]


@pytest.mark.slow
async def test_health_props_slots_and_metrics(shared_server: ResidentServer) -> None:
    async with shared_server.client() as client:
        assert await client.health() is HealthState.OK
        props = await client.props()
        assert props.total_slots == TEST_SLOTS
        assert props.model_path.endswith(".gguf")
        slots = await client.slots()
        assert [slot.id for slot in slots] == list(range(TEST_SLOTS))
        before = await client.metrics()
        await client.chat(HELLO, max_tokens=4, temperature=0.0)
        after = await client.metrics()
        assert after.tokens_predicted_total > before.tokens_predicted_total


@pytest.mark.slow
async def test_chat_reports_tokens_timings_and_logprobs(shared_server: ResidentServer) -> None:
    async with shared_server.client() as client:
        completion = await client.chat(HELLO, max_tokens=6, temperature=0.0, top_logprobs=3)
    stats = completion.stats
    assert completion.text
    assert completion.finish_reason in {"stop", "length"}
    assert stats.prompt_tokens == stats.cached_tokens + stats.evaluated_tokens > 0
    assert 0 < stats.completion_tokens <= 6
    assert stats.prompt_ms > 0
    assert stats.predicted_ms >= 0
    logprobs = completion.logprobs
    assert logprobs is not None
    assert len(logprobs) == stats.completion_tokens
    assert all(len(token.top) == 3 for token in logprobs)


@pytest.mark.slow
async def test_tokenize_and_template(shared_server: ResidentServer) -> None:
    async with shared_server.client() as client:
        tokens = await client.tokenize("The quick brown fox")
        prompt = await client.apply_template(HELLO)
    assert 3 <= len(tokens) <= 8
    assert "Say hello in one word." in prompt


@pytest.mark.slow
async def test_slot_save_restore_erase(shared_server: ResidentServer) -> None:
    async with shared_server.client() as client:
        await client.chat(HELLO, max_tokens=2, temperature=0.0, slot_id=1)
        saved = await client.save_slot(1, "client-test.bin")
        assert saved.tokens > 0
        assert saved.elapsed_ms >= 0
        restored = await client.restore_slot(2, "client-test.bin")
        assert restored.tokens == saved.tokens
        erased = await client.erase_slot(2)
        assert erased.id_slot == 2
        with pytest.raises(LlamaRequestError):
            await client.restore_slot(3, "no-such-file.bin")


@pytest.mark.slow
async def test_a_prompt_longer_than_the_slot_context_is_a_request_error(
    shared_server: ResidentServer,
) -> None:
    long_prompt = [ChatMessage(role="user", content="word " * 5000)]
    async with shared_server.client() as client:
        with pytest.raises(LlamaRequestError):
            await client.chat(long_prompt, max_tokens=4)


async def test_connection_refused_is_retried_then_raised() -> None:
    async with LlamaClient(f"http://127.0.0.1:{free_port()}", retry=FAST_RETRY) as client:
        with pytest.raises(LlamaConnectionError):
            await client.props()


def _transport(responses: list[httpx.Response]) -> tuple[httpx.MockTransport, Callable[[], int]]:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return responses[min(calls, len(responses)) - 1]

    return httpx.MockTransport(handler), lambda: calls


_LOADING = httpx.Response(503, json={"error": {"code": 503, "message": "Loading model"}})
_CHAT_OK = chat_body()


_PROPS_OK = httpx.Response(200, json={"model_path": "/m/smollm2.gguf", "total_slots": 4})


async def test_a_control_call_is_retried_while_the_model_loads() -> None:
    transport, calls = _transport([_LOADING, _LOADING, _PROPS_OK])
    async with LlamaClient("http://llama", retry=FAST_RETRY, transport=transport) as client:
        props = await client.props()
    assert calls() == 3
    assert props.total_slots == 4


async def test_a_control_call_past_the_retry_budget_raises_loading() -> None:
    transport, calls = _transport([_LOADING])
    async with LlamaClient("http://llama", retry=FAST_RETRY, transport=transport) as client:
        with pytest.raises(LlamaLoadingError):
            await client.props()
        assert await client.health() is HealthState.LOADING
    assert calls() == FAST_RETRY.attempts + 1


async def test_a_retry_waits_half_to_all_of_its_capped_exponential_backoff(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    waits: list[float] = []
    real_sleep = asyncio.sleep

    async def recorded(seconds: float) -> None:
        waits.append(seconds)
        await real_sleep(0)

    monkeypatch.setattr(asyncio, "sleep", recorded)
    policy = RetryPolicy(attempts=5, backoff_s=1.0, max_backoff_s=3.0)
    transport, calls = _transport([_LOADING])
    async with LlamaClient("http://llama", retry=policy, transport=transport) as client:
        with pytest.raises(LlamaLoadingError):
            await client.props()
    assert calls() == 5
    # Backoffs 1, 2, 4 -> 3 (capped), 8 -> 3: each wait between half of it and all of it.
    assert len(waits) == 4
    for wait, backoff in zip(waits, (1.0, 2.0, 3.0, 3.0), strict=True):
        assert backoff / 2 <= wait <= backoff


async def test_generation_makes_one_attempt_the_engine_retries() -> None:
    transport, calls = _transport([_LOADING, httpx.Response(200, json=_CHAT_OK)])
    async with LlamaClient("http://llama", retry=FAST_RETRY, transport=transport) as client:
        with pytest.raises(LlamaLoadingError):
            await client.chat(HELLO, max_tokens=2)
        assert calls() == 1
        completion = await client.chat(HELLO, max_tokens=2)
    assert completion.stats.cached_tokens == 25


@pytest.mark.parametrize(
    "schema",
    [{"type": "number", "maximum": float("inf")}, {"type": "string", "pattern": "bad \ud800"}],
    ids=["infinity", "lone-surrogate"],
)
async def test_a_body_json_cannot_carry_is_refused_unsent(schema: dict[str, object]) -> None:
    """httpx would raise a bare ValueError while writing it, out of the engine's batch."""
    transport, calls = _transport([httpx.Response(200, json=_CHAT_OK)])
    async with LlamaClient("http://llama", transport=transport) as client:
        with pytest.raises(LlamaBodyError, match="cannot be sent as JSON"):
            await client.chat(HELLO, max_tokens=2, json_schema=schema)
        assert calls() == 0
        completion = await client.chat(HELLO, max_tokens=2, json_schema={"type": "string"})
    assert completion.stats.cached_tokens == 25


async def test_generation_is_cut_at_its_deadline() -> None:
    async def never(request: httpx.Request) -> httpx.Response:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    transport = httpx.MockTransport(never)
    async with LlamaClient("http://llama", transport=transport) as client:
        with pytest.raises(LlamaTimeoutError):
            await client.chat(HELLO, max_tokens=2, timeout_s=0.2)


async def test_waiting_for_health_ends_at_its_timeout_with_a_probe_in_flight() -> None:
    """Found by review: the wait checked its deadline between probes only, so a server that
    accepted and never answered held it one whole probe (35 s) past the timeout."""

    async def never(request: httpx.Request) -> httpx.Response:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    loop = asyncio.get_running_loop()
    async with LlamaClient("http://llama", transport=httpx.MockTransport(never)) as client:
        began = loop.time()
        with pytest.raises(LlamaTimeoutError, match="not healthy after"):
            await client.wait_until_healthy(0.3)
    assert loop.time() - began < 5.0  # a probe's own bound is 35 s


def test_reasoning_content_is_kept_apart_from_the_answer() -> None:
    body = {
        "choices": [
            {
                "message": {"content": "4", "reasoning_content": "2 + 2 is 4."},
                "finish_reason": "stop",
            }
        ]
    }
    completion = ChatCompletion.model_validate_json(json.dumps(body))
    assert (completion.text, completion.reasoning_content) == ("4", "2 + 2 is 4.")


def test_slots_report_decoded_tokens_for_the_watchdog() -> None:
    slot = SlotState.model_validate(
        {"id": 0, "is_processing": True, "next_token": {"n_decoded": 17, "n_remain": 3}}
    )
    assert slot.n_decoded == 17


async def test_malformed_body_is_a_response_error_not_a_crash() -> None:
    transport, _ = _transport([httpx.Response(200, content=b'{"choices": []}')])
    async with LlamaClient("http://llama", retry=FAST_RETRY, transport=transport) as client:
        with pytest.raises(LlamaResponseError, match="ChatCompletion"):
            await client.chat(HELLO, max_tokens=2)


@pytest.mark.parametrize(
    "body", [b"not gzip", gzip.compress(b" " * (4 << 20))], ids=["bad", "bomb"]
)
async def test_a_compressed_body_is_refused_unread_for_every_call(body: bytes) -> None:
    """Found by review: a body its content-encoding does not decode raised httpx.DecodingError
    past the engine's per-request handling; and the byte cap counted a gzip body's bytes as
    sent, so 4 KiB of gzip decoded to 4 MiB past a 64 KiB cap. The client asks for no encoding
    (llama-server sends none) and refuses one it did not ask for."""
    asked: list[str | None] = []

    def gzipped(request: httpx.Request) -> httpx.Response:
        asked.append(request.headers.get("accept-encoding"))
        headers = {"content-encoding": "gzip"}
        return httpx.Response(200, headers=headers, stream=httpx.ByteStream(body))

    transport = httpx.MockTransport(gzipped)
    async with LlamaClient(
        "http://llama", retry=FAST_RETRY, transport=transport, max_body_bytes=64 * 1024
    ) as client:
        with pytest.raises(LlamaBodyTooLargeError, match="gzip-encoded though none was asked"):
            await client.props()
        with pytest.raises(LlamaBodyTooLargeError, match="gzip-encoded though none was asked"):
            await client.chat(HELLO, max_tokens=2)
    assert asked == ["identity", "identity"]  # refused at once: not retried


@pytest.mark.parametrize(
    "tokens",
    [[{"piece": "a"}], ["x"], [None], [1.5], [True]],
    ids=["no-id", "str", "null", "float", "bool"],
)
async def test_a_malformed_token_list_is_a_response_error(tokens: list[object]) -> None:
    transport, _ = _transport([httpx.Response(200, json={"tokens": tokens})])
    async with LlamaClient("http://llama", retry=FAST_RETRY, transport=transport) as client:
        with pytest.raises(LlamaResponseError, match="malformed token list"):
            await client.tokenize("hi")
    good, _ = _transport([httpx.Response(200, json={"tokens": [1, {"id": 2, "piece": "b"}]})])
    async with LlamaClient("http://llama", retry=FAST_RETRY, transport=good) as client:
        assert await client.tokenize("hi") == [1, 2]


async def test_unknown_health_status_is_refused() -> None:
    transport, _ = _transport([httpx.Response(200, json={"status": "degraded"})])
    async with LlamaClient("http://llama", transport=transport) as client:
        with pytest.raises(LlamaResponseError, match="degraded"):
            await client.health()


def test_ik_llama_response_without_cache_n_derives_cached_tokens_from_n_past() -> None:
    # ik_llama.cpp: no cache_n and no usage details; n_past counts prompt + generated tokens.
    body = {
        "choices": [{"index": 0, "finish_reason": "length", "message": {"content": "x y z"}}],
        "timings": {"prompt_n": 8, "prompt_ms": 12.0, "predicted_n": 3, "predicted_ms": 9.0},
        "n_past": 1211,
    }
    stats = ChatCompletion.model_validate_json(json.dumps(body)).stats
    assert stats.cached_tokens == 1200
    assert stats.evaluated_tokens == 8
    assert stats.prompt_tokens == 1208
    assert stats.completion_tokens == 3


def test_a_response_with_no_timings_at_all_still_parses() -> None:
    body = {"choices": [{"message": {"content": "ok"}}], "usage": {"prompt_tokens": 9}}
    stats = ChatCompletion.model_validate_json(json.dumps(body)).stats
    assert stats.prompt_tokens == 9
    assert stats.cached_tokens == 0


def _caps_server(caps: dict[str, bool], paths: list[str]) -> httpx.MockTransport:
    """A server whose /props reports `caps` and that answers every chat; records the paths."""

    def handler(request: httpx.Request) -> httpx.Response:
        paths.append(request.url.path)
        if request.url.path == "/props":
            return httpx.Response(200, json={"chat_template_caps": caps})
        return httpx.Response(200, json=chat_body("ok"))

    return httpx.MockTransport(handler)


async def test_tools_go_out_only_to_a_server_whose_chat_template_renders_them() -> None:
    """llama-server drops the tools a chat template cannot render and answers as if none were
    given: such a request is refused before it is sent (`/props`, asked once per client)."""
    tools = ChatExtras(tools=[{"type": "function", "function": {"name": "f"}}])
    sent = "/v1/chat/completions"
    refused: list[str] = []
    async with LlamaClient(
        "http://llama", transport=_caps_server({"supports_tools": False}, refused)
    ) as client:
        await client.chat(HELLO, max_tokens=4)  # no tools: nothing asked
        for _ in range(2):
            with pytest.raises(LlamaFeatureError, match="does not render tools"):
                await client.chat(HELLO, max_tokens=4, extras=tools)
    assert refused == [sent, "/props"]
    # A build that does not report its template's capabilities gets the tools as given.
    unknown: list[str] = []
    async with LlamaClient("http://llama", transport=_caps_server({}, unknown)) as client:
        for _ in range(2):
            await client.chat(HELLO, max_tokens=4, extras=tools)
    assert unknown == ["/props", sent, sent]


class _Endless(httpx.AsyncByteStream):
    """A body that never ends (no newline either): what a broken proxy or server could send."""

    def __init__(self) -> None:
        self.sent = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            self.sent += 4096
            yield b"x" * 4096


@pytest.mark.parametrize("content_type", ["application/json", "text/event-stream"])
async def test_a_body_without_end_is_cut_at_the_cap_for_every_call(content_type: str) -> None:
    """Found by review: a body was read whole, so a server that never ended one grew the
    process until memory ran out; the streamed answer's line reader held an endless line too."""
    bodies: list[_Endless] = []

    def endless(request: httpx.Request) -> httpx.Response:
        bodies.append(_Endless())
        return httpx.Response(200, headers={"content-type": content_type}, stream=bodies[-1])

    transport = httpx.MockTransport(endless)
    cap = 64 * 1024
    async with LlamaClient(
        "http://llama", retry=FAST_RETRY, transport=transport, max_body_bytes=cap
    ) as client:
        with pytest.raises(LlamaBodyTooLargeError, match=f"over {cap} bytes"):
            await client.chat(HELLO, max_tokens=2)
        with pytest.raises(LlamaBodyTooLargeError, match=f"over {cap} bytes"):
            await client.props()
    assert len(bodies) == 2
    assert all(cap < body.sent <= cap + 4096 for body in bodies)


async def test_a_body_at_the_cap_is_read() -> None:
    body = json.dumps({"model_path": "/m/smollm2.gguf", "total_slots": 4}).encode()
    transport, _ = _transport([httpx.Response(200, stream=httpx.ByteStream(body))])
    async with LlamaClient("http://llama", transport=transport, max_body_bytes=len(body)) as client:
        assert (await client.props()).total_slots == 4


async def test_an_endless_event_stream_over_a_real_socket_is_cut_at_the_cap() -> None:
    """The same cap through httpx's own transport: a server that opens an event stream and
    sends one line without end."""

    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\ndata: ")
        with contextlib.suppress(ConnectionError):
            while True:
                writer.write(b"x" * 65536)
                await writer.drain()

    server = await asyncio.start_server(endless, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    cap = 1024 * 1024
    async with server, LlamaClient(f"http://127.0.0.1:{port}", max_body_bytes=cap) as client:
        with pytest.raises(LlamaBodyTooLargeError, match=f"over {cap} bytes"):
            await client.chat(HELLO, max_tokens=2)
