"""What the client sends: OpenAI-style chat messages, the extra fields a request may carry, and
the bodies built from them: `chat_body` (`/v1/chat/completions`) and `completion_body`
(`/v1/completions`, a raw prompt), buildable without a server, so what reaches the server can
be checked."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class ChatMessage(BaseModel):
    """One OpenAI-style chat message."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Literal["system", "user", "assistant"]
    content: str


class ChatExtras(BaseModel):
    """Fields llama-server takes as OpenAI does, sent as they are; None: not sent. The sampling
    ones apply to both endpoints, the tool ones to chat only (the chat template renders them)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stop: list[str] | None = Field(default=None, description="Stop strings (at most 4).")
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = Field(
        default=None, description="Token id (as a string) -> bias, OpenAI's shape."
    )
    tools: list[dict[str, Any]] | None = Field(
        default=None, description="OpenAI function tools, as given (chat only)."
    )
    tool_choice: Literal["none", "auto", "required"] | None = Field(
        default=None, description="Whether the answer may or must call a tool (chat only)."
    )
    parallel_tool_calls: bool | None = Field(
        default=None, description="Whether one answer may call several tools (chat only)."
    )

    def body(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)

    @property
    def has_tools(self) -> bool:
        return any(
            value is not None for value in (self.tools, self.tool_choice, self.parallel_tool_calls)
        )


def _stream_unless_logprobs(body: dict[str, Any], logprobs: Mapping[str, Any]) -> None:
    if logprobs:
        body.update(logprobs)
    else:
        # Streamed: a cancelled request then stops at once (a non-streamed one runs to its
        # end). Not with logprobs: the stream drops the entry of a token with empty text.
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}


def _common_body(
    *,
    max_tokens: int,
    temperature: float,
    top_p: float,
    seed: int | None,
    slot_id: int | None,
    extras: ChatExtras | None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
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
    return body


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
    body = {
        "messages": [m.model_dump() for m in messages],
        **_common_body(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            slot_id=slot_id,
            extras=extras,
        ),
    }
    logprobs = {"logprobs": True, "top_logprobs": top_logprobs} if top_logprobs else {}
    _stream_unless_logprobs(body, logprobs)
    if json_schema is not None:
        body["response_format"] = {"type": "json_object", "schema": dict(json_schema)}
    return body


def completion_body(
    prompt: str,
    *,
    max_tokens: int,
    temperature: float,
    top_p: float,
    seed: int | None = None,
    slot_id: int | None = None,
    logprobs: int = 0,
    extras: ChatExtras | None = None,
) -> dict[str, Any]:
    """The JSON body `LlamaClient.text_completion` posts to `/v1/completions`: the prompt as it
    is (no chat template), `logprobs` the alternatives per token (OpenAI's integer)."""
    if extras is not None and extras.has_tools:
        raise ValueError("tools apply to chat requests only, not to a raw prompt")
    body = {
        "prompt": prompt,
        **_common_body(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            slot_id=slot_id,
            extras=extras,
        ),
    }
    _stream_unless_logprobs(body, {"logprobs": logprobs} if logprobs else {})
    return body
