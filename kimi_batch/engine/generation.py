"""What the engine is asked to generate and what it hands back.

A request carries only the user side of the conversation: the system digest is prepended by
`kimi_batch.engine.prompt.assemble_messages`, the one place prompts are assembled, so no caller
can put a byte in front of the cached prefix.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.llama import ChatMessage, TokenLogprob

__all__ = [
    "GenerationRequest",
    "GenerationResult",
    "SamplingParams",
    "request_key",
    "row_request_id",
]


class SamplingParams(BaseModel):
    """Sampling settings of one request; part of its content hash."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_tokens: int = Field(default=256, gt=0, description="Clamped to the server's n_predict.")
    temperature: float = Field(default=0.7, ge=0.0, le=2.0)
    top_p: float = Field(default=0.95, gt=0.0, le=1.0)
    seed: int | None = Field(default=None, description="Fixed seed for reproducible sampling.")
    n_probs: int = Field(default=0, ge=0, le=20, description="Top-k logprobs per token; 0 = off.")
    json_schema: dict[str, Any] | None = Field(
        default=None, description="Constrain the output to this JSON schema (llama.cpp grammar)."
    )


def request_key(
    *, digest_sha256: str, model: str, params: SamplingParams, messages: list[ChatMessage]
) -> str:
    """Content hash that identifies a request across reruns (the ledger key)."""
    canonical = json.dumps(
        {
            "digest": digest_sha256,
            "model": model,
            "params": params.model_dump(mode="json"),
            "messages": [message.model_dump(mode="json") for message in messages],
        },
        sort_keys=True,
        ensure_ascii=False,
        separators=(",", ":"),
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:32]


def row_request_id(content_key: str, input_id: str) -> str:
    """`request_id` of an output row: unique per input even when two inputs ask the same."""
    return hashlib.sha256(f"{content_key}|{input_id}".encode()).hexdigest()[:32]


class GenerationRequest(BaseModel):
    """One request: user-side messages plus sampling params, tied to an input row."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input_id: str = Field(min_length=1)
    messages: list[ChatMessage] = Field(min_length=1, description="User side only, no system.")
    params: SamplingParams = Field(default_factory=SamplingParams)
    tag: str = Field(default="", description="Free label carried to the result (e.g. strategy).")
    priority: int = Field(
        default=0,
        ge=0,
        description="Lower is handed out first (a night's partitions, oldest first); not part "
        "of the request's key.",
    )


class GenerationResult(BaseModel):
    """A finished request as written to the ledger."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    request_id: str
    input_id: str
    tag: str
    model: str
    digest_sha256: str
    text: str
    finish_reason: str
    prompt_tokens: int = Field(ge=0)
    cached_tokens: int = Field(ge=0)
    completion_tokens: int = Field(ge=0)
    prompt_ms: float = Field(ge=0)
    predicted_ms: float = Field(ge=0)
    latency_ms: float = Field(ge=0)
    endpoint: str
    slot_id: int | None
    logprobs: list[TokenLogprob] | None
    created_at: datetime
    # Defaulted so rows recorded before the field existed still load from the ledger.
    reasoning_content: str | None = Field(
        default=None, description="A reasoning model's thinking, kept apart from `text`."
    )
    draft_tokens: int | None = Field(
        default=None, ge=0, description="Speculative decoding: tokens the draft proposed."
    )
    draft_accepted_tokens: int | None = Field(
        default=None, ge=0, description="Speculative decoding: drafted tokens accepted."
    )

    @property
    def truncated(self) -> bool:
        """Stopped by max_tokens (or the server's n_predict): the answer may be incomplete."""
        return self.finish_reason == "length"

    @property
    def empty(self) -> bool:
        return not self.text.strip()
