"""Small value objects shared by the client and the layers above it."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

__all__ = ["ChatMessage", "TokenLogprob", "TopLogprob"]


class ChatMessage(BaseModel):
    """One OpenAI-style chat message."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Literal["system", "user", "assistant"]
    content: str


class TopLogprob(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    token: str
    logprob: float


class TokenLogprob(BaseModel):
    """A generated token with its logprob and the top-k alternatives (`n_probs`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    token: str
    logprob: float
    top: list[TopLogprob]
