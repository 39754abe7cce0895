"""What the client sends: OpenAI-style chat messages, the extra sampling fields a request may
carry, and the `/v1/chat/completions` body built from them (`chat_body`, buildable without a
server, so what reaches the server can be checked)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ChatExtras", "ChatMessage", "chat_body"]


class ChatMessage(BaseModel):
    """One OpenAI-style chat message."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Literal["system", "user", "assistant"]
    content: str


class ChatExtras(BaseModel):
    """Sampling fields llama-server's chat endpoint takes as OpenAI does; None: not sent."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stop: list[str] | None = Field(default=None, description="Stop strings (at most 4).")
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = Field(
        default=None, description="Token id (as a string) -> bias, OpenAI's shape."
    )

    def body(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)


def chat_body(
    messages: Sequence[ChatMessage],
    *,
    max_tokens: int,
    temperature: float,
    top_p: float,
    seed: int | None = None,
    slot_id: int | None = None,
    top_logprobs: int = 0,
    json_schema: Mapping[str, Any] | None = None,
    extras: ChatExtras | None = None,
) -> dict[str, Any]:
    """The JSON body `LlamaClient.chat` posts to `/v1/chat/completions`."""
    body: dict[str, Any] = {
        "messages": [m.model_dump() for m in messages],
        "max_tokens": max_tokens,
        "temperature": temperature,
        "top_p": top_p,
        "cache_prompt": True,
    }
    if extras is not None:
        body.update(extras.body())
    if seed is not None:
        body["seed"] = seed
    if slot_id is not None:
        body["id_slot"] = slot_id
    if top_logprobs:
        body["logprobs"] = True
        body["top_logprobs"] = top_logprobs
    else:
        # Streamed: a cancelled request then stops at once (a non-streamed one runs to its
        # end). Not with logprobs: the stream drops the entry of a token with empty text.
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    if json_schema is not None:
        body["response_format"] = {"type": "json_object", "schema": dict(json_schema)}
    return body
