"""What the engine is asked to generate and what it hands back.

A request carries only the user side of the conversation: the system digest (the engine's, or the
request's own: a Batch API line's system prompt) is prepended by
`kimi_batch.engine.prompt.assemble_messages`, the one place prompts are assembled, so no caller
can put a byte in front of the cached prefix. A `completion` request (a raw prompt, sent to
`/v1/completions` with no chat template) is the exception: it is sent exactly as written, no
digest in front of it, and its kind is part of its key, so a chat line and a completion line
with the same text never share an answer.

Request identity (the ledger key): a request whose answer is determined by its content (greedy,
or a fixed seed) is keyed by that content alone, so every input asking it shares one answer. Any
other request is a sample: its key adds the sample's identity (`GenerationRequest.sample`: the
scope its input row lives in, a stage's partition or a Batch API batch, and its input id), so N
inputs asking the same get N answers, and a rerun of the same scope still finds its own.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kimi_batch.engine.digest import SystemDigest
from kimi_batch.llama import ChatExtras, ChatMessage, TokenLogprob, ToolCall

RequestKind = Literal["chat", "completion"]
"""`chat`: messages through the chat template, after the digest; `completion`: a raw prompt."""

# llama.cpp's LLAMA_DEFAULT_SEED: a seed of 0xFFFFFFFF (or -1) asks for a random one.
_RANDOM_SEED = 0xFFFFFFFF


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
    # OpenAI's other sampling fields, sent as they are (`ChatExtras`); None: not sent. Part of
    # the key only when set, so a request without them keeps the key it always had.
    stop: list[str] | None = Field(default=None, description="Stop strings.")
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = Field(default=None, description="Token id -> bias.")
    # The tools a chat answer may call, as OpenAI takes them (the chat template renders them).
    tools: list[dict[str, Any]] | None = Field(default=None, description="Function tools.")
    tool_choice: Literal["none", "auto", "required"] | None = None
    parallel_tool_calls: bool | None = None

    def extras(self) -> ChatExtras | None:
        """The fields sent besides the core ones; None when none is set."""
        extras = ChatExtras.model_validate(
            self.model_dump(include=set(ChatExtras.model_fields), exclude_none=True)
        )
        return extras if extras.body() else None

    def key_fields(self) -> dict[str, Any]:
        """What the ledger key hashes: every field, the extras only when set."""
        core = self.model_dump(mode="json", exclude=set(ChatExtras.model_fields))
        extras = self.extras()
        return {**core, **(extras.body() if extras is not None else {})}

    @property
    def determined(self) -> bool:
        """Whether the answer follows from the request: greedy decoding or a fixed seed. Only
        such requests share an answer across inputs (up to llama.cpp's batched numerics)."""
        return self.temperature == 0 or (self.seed is not None and 0 <= self.seed < _RANDOM_SEED)


def request_key(
    *,
    digest_sha256: str,
    model: str,
    params: SamplingParams,
    messages: list[ChatMessage],
    sample: str | None = None,
    kind: RequestKind = "chat",
) -> str:
    """Hash that identifies a request across reruns (the ledger key): its content and kind,
    plus the sample's identity when the answer is not determined (`GenerationRequest.sample`)."""
    content: dict[str, object] = {
        "digest": digest_sha256,
        "model": model,
        "params": params.key_fields(),
        "messages": [message.model_dump(mode="json") for message in messages],
    }
    if kind != "chat":
        # Only here: a chat request keeps the key it always had.
        content["kind"] = kind
    if sample is not None:
        # Only here: a determined request keeps the key it always had (ledgers stay valid).
        content["sample"] = sample
    canonical = json.dumps(
        content,
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
        "of the request's key. A request several inputs share goes out at the lowest.",
    )
    sample_scope: str = Field(
        default="",
        description="Where the input row lives (a stage's partition, a Batch API batch): with "
        "`input_id` it names the sample of a request whose answer is not determined.",
    )
    kind: RequestKind = Field(
        default="chat",
        description="`completion`: `messages` is one user message, the raw prompt, sent as it "
        "is to /v1/completions (no chat template, no digest).",
    )

    @model_validator(mode="after")
    def _one_raw_prompt(self) -> GenerationRequest:
        if self.kind != "completion":
            return self
        if [m.role for m in self.messages] != ["user"]:
            raise ValueError("a completion request is one user message: the raw prompt")
        extras = self.params.extras()
        if self.params.json_schema is not None or (extras is not None and extras.has_tools):
            raise ValueError(
                "a completion request carries no tools and no JSON schema (they go through "
                "the chat endpoint)"
            )
        return self

    @property
    def raw_prompt(self) -> str:
        """The text a completion request sends as it is."""
        return self.messages[0].content

    digest: SystemDigest | None = Field(
        default=None,
        repr=False,
        description="The request's own system digest (a Batch API line's system prompt), sent "
        "in place of the engine's and keyed by its sha; None: the engine's digest.",
    )

    @property
    def sample(self) -> str | None:
        """This request's own sample in the ledger key; None when the answer is determined
        (temperature 0 or a fixed seed), which every input asking the same then shares."""
        if self.params.determined:
            return None
        return json.dumps([self.sample_scope, self.input_id], ensure_ascii=False)


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
    tool_calls: list[ToolCall] | None = Field(
        default=None, description="The tools the answer calls (`finish_reason` tool_calls)."
    )

    @property
    def truncated(self) -> bool:
        """Stopped by max_tokens (or the server's n_predict): the answer may be incomplete."""
        return self.finish_reason == "length"

    @property
    def empty(self) -> bool:
        """No text and no tool call: nothing was answered."""
        return not self.text.strip() and not self.tool_calls
