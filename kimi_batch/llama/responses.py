"""Pydantic models of llama-server's answers (chat and text completions, streamed or whole), and
the logprobs and tool calls the layers above keep. What the server says about itself (health,
props, slots, metrics): `server_state`.

Both llama.cpp and the ik_llama.cpp fork are accepted: unknown fields are ignored, fields one of
them lacks are optional, and derived values (cached tokens) fall back through what each reports.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator


class TopLogprob(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    token: str
    logprob: float
    # llama-server's token id (`id` beside each entry); None from a server that does not say,
    # and in rows written before it was kept.
    id: int | None = None


class TokenLogprob(BaseModel):
    """A generated token with its logprob and the top-k alternatives (`n_probs`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    token: str
    logprob: float
    top: list[TopLogprob]
    id: int | None = Field(default=None, description="The token's id in the model's vocabulary.")


class ToolCallFunction(BaseModel):
    """The function a tool call names, and its arguments as the model wrote them (JSON text)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    arguments: str


class ToolCall(BaseModel):
    """One tool call of an answer, in OpenAI's shape (`choices[0].message.tool_calls[]`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class _Lenient(BaseModel):
    """Server payload: extra keys are ignored so a newer server never breaks the client."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class _Counts(_Lenient):
    """Counts and durations a server reports about an answer: one no server can mean (a
    negative count, a negative or NaN duration) is read as absent, its field's default.

    These numbers are bookkeeping beside the answer, as optional as the fields a build lacks:
    `_stats` already reads an impossible cached count as none, and a fork that writes -1 for
    "unknown" (llama.cpp's own convention elsewhere) would otherwise have every answer of a
    night refused, retried and failed, although its text is good. Passed through, they made
    `GenerationStats` raise pydantic's error inside the engine's recording, ending the run.
    A number of the wrong type is still refused (`LlamaResponseError`), as any malformed body."""

    @field_validator("*", mode="after")
    @classmethod
    def _absent_when_impossible(cls, value: object, info: ValidationInfo) -> object:
        return _default_when_impossible(cls, value, info)


def _default_when_impossible(model: type[BaseModel], value: object, info: ValidationInfo) -> object:
    """`value`, or its field's default when it is a number no server can mean (see `_Counts`)."""
    if isinstance(value, int | float) and not value >= 0:  # NaN compares False
        return model.model_fields[info.field_name or ""].default
    return value


class Timings(_Counts):
    """`timings` of a completion. ik_llama.cpp has no `cache_n`."""

    cache_n: int | None = None
    prompt_n: int = 0
    prompt_ms: float = 0.0
    prompt_per_second: float | None = None
    predicted_n: int = 0
    predicted_ms: float = 0.0
    predicted_per_second: float | None = None
    n_past: int | None = None
    # Speculative decoding (llama.cpp, only when the server runs it): tokens the draft proposed
    # and those the model accepted.
    draft_n: int | None = None
    draft_n_accepted: int | None = None


class PromptTokensDetails(_Counts):
    cached_tokens: int | None = None


class ChatUsage(_Counts):
    # None when the server did not say (or said -1): a total of 0 would be taken as known, and
    # `_stats` would not fall back to `n_past` for the cached tokens.
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None
    prompt_tokens_details: PromptTokensDetails | None = None


class GenerationStats(BaseModel):
    """Token accounting of one request, normalized across server builds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt_tokens: int = Field(ge=0, description="All prompt tokens, cached included.")
    cached_tokens: int = Field(ge=0, description="Prompt tokens reused from the KV cache.")
    evaluated_tokens: int = Field(ge=0, description="Prompt tokens evaluated by this request.")
    completion_tokens: int = Field(ge=0)
    prompt_ms: float = Field(ge=0)
    predicted_ms: float = Field(ge=0)
    draft_tokens: int | None = Field(default=None, ge=0, description="Speculation: drafted.")
    draft_accepted_tokens: int | None = Field(default=None, ge=0, description="... accepted.")


def _stats(
    timings: Timings | None,
    *,
    prompt_total: int | None,
    cached_hint: int | None,
    completion_tokens: int,
    n_past: int | None,
) -> GenerationStats:
    """Derive cached tokens from the best field each build reports.

    Order: llama.cpp `cache_n`; OpenAI `cached_tokens`; total prompt minus evaluated; ik_llama.cpp's
    `n_past` (prompt + generated tokens in the slot) minus what this request evaluated and generated.
    """
    evaluated = timings.prompt_n if timings else 0
    predicted = timings.predicted_n if timings and timings.predicted_n else completion_tokens
    cached: int | None = timings.cache_n if timings else None
    if cached is None:
        cached = cached_hint
    if cached is None and prompt_total is not None and timings is not None:
        cached = prompt_total - evaluated
    past = n_past if n_past is not None else (timings.n_past if timings else None)
    if cached is None and past is not None:
        cached = past - evaluated - predicted
    cached = max(cached or 0, 0)
    total = prompt_total if prompt_total is not None else evaluated + cached
    return GenerationStats(
        prompt_tokens=max(total, evaluated + cached),
        cached_tokens=cached,
        evaluated_tokens=evaluated,
        completion_tokens=predicted,
        prompt_ms=timings.prompt_ms if timings else 0.0,
        predicted_ms=timings.predicted_ms if timings else 0.0,
        draft_tokens=timings.draft_n if timings else None,
        draft_accepted_tokens=timings.draft_n_accepted if timings else None,
    )


class _ServerTopLogprob(_Lenient):
    id: int | None = None
    token: str = ""
    logprob: float = 0.0

    def to_top(self) -> TopLogprob:
        return TopLogprob(token=self.token, logprob=self.logprob, id=self.id)


class CompletionProbability(_Lenient):
    """One entry of `/completion`'s `completion_probabilities` (post-sampling format)."""

    id: int | None = None
    token: str = ""
    logprob: float = 0.0
    top_logprobs: list[_ServerTopLogprob] = Field(default_factory=list)


class Completion(_Lenient):
    """Response of `POST /completion` (non-streaming)."""

    content: str = ""
    model: str = ""
    id_slot: int | None = None
    stop: bool = True
    stop_type: str | None = None
    truncated: bool = False
    tokens_predicted: int = 0
    tokens_evaluated: int | None = None
    tokens_cached: int | None = None
    timings: Timings | None = None
    completion_probabilities: list[CompletionProbability] | None = None

    # Its counts are read as `_Counts` reads usage and timings: a negative one as absent (it
    # made `stats` raise pydantic's ValidationError).
    @field_validator("tokens_predicted", "tokens_evaluated", "tokens_cached", mode="after")
    @classmethod
    def _absent_when_impossible(cls, value: object, info: ValidationInfo) -> object:
        return _default_when_impossible(cls, value, info)

    @property
    def finish_reason(self) -> str:
        return "length" if self.stop_type == "limit" else "stop"

    @property
    def stats(self) -> GenerationStats:
        return _stats(
            self.timings,
            prompt_total=self.tokens_evaluated,
            cached_hint=None,
            completion_tokens=self.tokens_predicted,
            n_past=self.tokens_cached,
        )


class ChatTokenLogprob(_Lenient):
    id: int | None = None
    token: str
    logprob: float
    top_logprobs: list[_ServerTopLogprob] = Field(default_factory=list)


class CompletionLogprobs(_Lenient):
    content: list[ChatTokenLogprob] | None = None


class _ServerFunction(_Lenient):
    name: str = ""
    arguments: str = ""


class ServerToolCall(_Lenient):
    """A tool call as llama-server writes it (`id` may be empty: not every chat format has one)."""

    id: str = ""
    type: str = "function"
    function: _ServerFunction = Field(default_factory=_ServerFunction)

    def to_tool_call(self, index: int) -> ToolCall:
        return ToolCall(
            id=self.id or f"call_{index}",
            function=ToolCallFunction(name=self.function.name, arguments=self.function.arguments),
        )


class ChatMessageOut(_Lenient):
    role: str = "assistant"
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ServerToolCall] | None = None


class ChatChoice(_Lenient):
    index: int = 0
    finish_reason: str | None = None
    message: ChatMessageOut
    logprobs: CompletionLogprobs | None = None


class AnswerEnvelope(_Lenient):
    """What a llama-server answer, and each chunk of a streamed one, carries besides its
    choices: ids, usage, llama.cpp's `timings` and slot fields."""

    id: str = ""
    model: str = ""
    created: int | None = None
    usage: ChatUsage | None = None
    timings: Timings | None = None
    id_slot: int | None = None
    n_past: int | None = None
    tokens_cached: int | None = None

    def envelope(self) -> dict[str, object]:
        """These fields alone, to build another answer around them."""
        return {name: getattr(self, name) for name in AnswerEnvelope.model_fields}


class ChatCompletion(AnswerEnvelope):
    """Response of `POST /v1/chat/completions`: the body of a non-streamed answer, or the one
    `chat_stream` rebuilds from a streamed answer's chunks."""

    choices: list[ChatChoice] = Field(min_length=1)

    @property
    def text(self) -> str:
        return self.choices[0].message.content or ""

    @property
    def finish_reason(self) -> str:
        return self.choices[0].finish_reason or "stop"

    @property
    def reasoning_content(self) -> str | None:
        """The thinking of a reasoning model, which llama.cpp returns apart from the answer."""
        return self.choices[0].message.reasoning_content or None

    @property
    def tool_calls(self) -> list[ToolCall] | None:
        """The answer's tool calls (`finish_reason` "tool_calls"); None when it made none."""
        calls = self.choices[0].message.tool_calls
        return [call.to_tool_call(i) for i, call in enumerate(calls)] if calls else None

    @property
    def logprobs(self) -> list[TokenLogprob] | None:
        content = self.choices[0].logprobs.content if self.choices[0].logprobs else None
        if content is None:
            return None
        return [
            TokenLogprob(
                token=item.token,
                logprob=item.logprob,
                top=[top.to_top() for top in item.top_logprobs],
                id=item.id,
            )
            for item in content
        ]

    @property
    def stats(self) -> GenerationStats:
        usage = self.usage
        details = usage.prompt_tokens_details if usage else None
        return _stats(
            self.timings,
            prompt_total=usage.prompt_tokens if usage else None,
            cached_hint=details.cached_tokens if details else None,
            completion_tokens=(usage.completion_tokens if usage else None) or 0,
            n_past=self.n_past if self.n_past is not None else self.tokens_cached,
        )


class _TextChoice(_Lenient):
    index: int = 0
    text: str = ""
    finish_reason: str | None = None
    logprobs: CompletionLogprobs | None = None


class TextCompletion(AnswerEnvelope):
    """Response of `POST /v1/completions` (a `text_completion`): llama.cpp writes its logprobs,
    usage and timings as the chat endpoint does, so it reads as that answer (`as_chat`)."""

    choices: list[_TextChoice] = Field(min_length=1)

    def as_chat(self) -> ChatCompletion:
        """The same answer as a `ChatCompletion` (its text as the message's content): one
        model for every answer the engine records."""
        choice = self.choices[0]
        message = ChatMessageOut(content=choice.text)
        chat_choice = ChatChoice(
            finish_reason=choice.finish_reason, message=message, logprobs=choice.logprobs
        )
        return ChatCompletion.model_validate({**self.envelope(), "choices": [chat_choice]})
