"""What the client's side of a generated token costs: streamed (as the engine sends every
request) against one JSON answer.

The engine streams so that a cancel frees the slot at once (this llama-server runs a non-streamed
answer whose client went away to its end: 9.5-18 s from a cancel to idle slots, 1.2 s streamed).
A streamed answer costs the client one event to read and parse per token; a non-streamed one
costs one body. Both passes send the same requests, every slot busy, and count this process's
CPU time (`time.process_time`, all its threads: nothing else may run in it meanwhile) per
generated token.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence

import httpx

from kimi_batch.engine import GenerationRequest, SamplingParams, SystemDigest, assemble_messages
from kimi_batch.llama import ChatCompletion, ChatMessage, LlamaClient, chat_body

__all__ = ["client_cpu_per_token"]


def _tokens(completion: ChatCompletion) -> int:
    return (completion.usage.completion_tokens if completion.usage else None) or 0


async def _streamed(
    client: LlamaClient, messages: list[ChatMessage], params: SamplingParams
) -> int:
    """As the engine sends it: `LlamaClient.chat` streams and rebuilds the answer."""
    completion = await client.chat(
        messages,
        max_tokens=params.max_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        seed=params.seed,
    )
    return _tokens(completion)


async def _not_streamed(
    http: httpx.AsyncClient, messages: list[ChatMessage], params: SamplingParams
) -> int:
    """The same body without `stream`: one JSON answer, parsed into the same model."""
    body = chat_body(
        messages,
        max_tokens=params.max_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        seed=params.seed,
    )
    plain = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    response = await http.post("/v1/chat/completions", json=plain)
    response.raise_for_status()
    return _tokens(ChatCompletion.model_validate_json(response.content))


_Send = Callable[[list[ChatMessage], SamplingParams], Awaitable[int]]


async def _pass(
    send: _Send, requests: Sequence[GenerationRequest], digest: SystemDigest, slots: int
) -> tuple[float, int]:
    """(CPU seconds, tokens generated) of the requests sent `slots` at a time."""
    gate = asyncio.Semaphore(slots)

    async def one(request: GenerationRequest) -> int:
        async with gate:
            return await send(assemble_messages(digest, request.messages), request.params)

    started = time.process_time()
    tokens = sum(await asyncio.gather(*(one(request) for request in requests)))
    return time.process_time() - started, tokens


async def client_cpu_per_token(
    base_url: str, requests: Sequence[GenerationRequest], digest: SystemDigest, slots: int
) -> dict[str, float]:
    """ms of client CPU per generated token, streamed and not, and the ratio of the two."""
    async with LlamaClient(base_url) as client:
        streamed_s, streamed_tokens = await _pass(
            lambda messages, params: _streamed(client, messages, params), requests, digest, slots
        )
    async with httpx.AsyncClient(base_url=base_url, timeout=600.0) as http:
        plain_s, plain_tokens = await _pass(
            lambda messages, params: _not_streamed(http, messages, params), requests, digest, slots
        )
    streamed = 1000 * streamed_s / max(streamed_tokens, 1)
    plain = 1000 * plain_s / max(plain_tokens, 1)
    return {
        "streamed_ms_per_token": round(streamed, 4),
        "not_streamed_ms_per_token": round(plain, 4),
        "streamed_over_not_streamed": round(streamed / plain, 2) if plain else 0.0,
        "tokens": streamed_tokens + plain_tokens,
    }
