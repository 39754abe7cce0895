"""A Batch API line as models: its body, chat, completion or Responses, into the request it runs.

What a client may send, typed: `_ChatBody` (`/v1/chat/completions`: messages, response format,
tools), `_CompletionBody` (`/v1/completions`: one raw prompt) and `_ResponsesBody`
(`/v1/responses`: instructions and input items, run as the chat request llama-server's own
/v1/responses makes of them) share the sampling fields (`_SamplingBody`); unset values take
OpenAI's defaults (temperature 1, top_p 1; a completion's max_tokens 16, a chat or Responses
answer's as long as the server allows). Which field names a body may hold
at all is `request_fields`, checked before these models are built; `request_line` turns a
line that validates into its `BatchRequestLine`, or raises (`LineRefusedError` names the field
of a line that validates as models but asks for what is not served).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kimi_batch.batch_api.lines import BatchRequestLine, LineKind
from kimi_batch.engine import SamplingParams
from kimi_batch.inputs import FunctionTool, ToolFunction
from kimi_batch.llama import ChatMessage

# OpenAI's defaults. A chat answer's max_tokens unset means "as long as the server allows" (the
# engine clamps it to the server's n_predict); a legacy completion's is 16 tokens.
_DEFAULT_CHAT_MAX_TOKENS = 1 << 20
_DEFAULT_COMPLETION_MAX_TOKENS = 16
_DEFAULT_TEMPERATURE = 1.0
_DEFAULT_TOP_P = 1.0
# Integers go into 64-bit columns and llama-server's JSON: a larger one is refused at validation.
_INT64_MAX = (1 << 63) - 1


class LineRefusedError(ValueError):
    """A line that validates as models but asks for what is not served; names its field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


class _Model(BaseModel):
    # Unknown fields are refused before these models are built (`request_fields.refused_field`).
    model_config = ConfigDict(extra="ignore", frozen=True)


class _Nested(BaseModel):
    """An object inside a body: a field it does not list is refused, named by its path (e.g.
    `body.text.fromat`), never dropped: the request that runs is the one that was sent."""

    model_config = ConfigDict(extra="forbid", frozen=True)


# Text content parts: a chat message's, and a Responses input item's (the model's own earlier
# turns come back as output_text).
_TEXT_PARTS = frozenset({"text", "input_text", "output_text"})
# A part's keys: `annotations` and `logprobs` come back on a model's output_text and do not
# change the prompt.
_PART_KEYS = frozenset({"type", "text", "annotations", "logprobs"})


def _part_text(index: int, part: Any) -> str:
    if not isinstance(part, dict) or part.get("type") not in _TEXT_PARTS:
        raise ValueError("only text content parts are supported")
    extra = sorted(str(key)[:100] for key in part if key not in _PART_KEYS)
    if extra:
        raise ValueError(f"part {index}: {extra[0]!r} is not supported here")
    text = part.get("text")
    if not isinstance(text, str):
        raise ValueError(f"part {index}: `text` must be a string")
    return text


class _Message(_Model):
    role: Literal["system", "developer", "user", "assistant"]
    content: str

    @field_validator("content", mode="before")
    @classmethod
    def _parts(cls, value: Any) -> Any:
        if isinstance(value, list):
            return "".join(_part_text(index, part) for index, part in enumerate(value))
        return value


class _InputItem(_Message):
    """A Responses input item: a message (`type` "message" or absent), text parts only."""

    type: Literal["message"] = "message"


class _JsonSchema(_Nested):
    """`response_format.json_schema`; the answer is constrained to `schema` (llama-server
    enforces it by grammar, so `strict` is what it does anyway; the name and description are
    labels)."""

    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class _ResponseFormat(_Nested):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: _JsonSchema | None = None

    def schema_or_none(self) -> dict[str, Any] | None:
        if self.type != "json_schema" and self.json_schema is not None:
            raise LineRefusedError(
                f"response_format.json_schema is only used with type 'json_schema', not "
                f"{self.type!r}",
                "body.response_format.json_schema",
            )
        if self.type == "text":
            return None
        if self.type == "json_object":
            return {"type": "object"}
        schema = self.json_schema.schema_ if self.json_schema else None
        if not isinstance(schema, dict):
            raise LineRefusedError(
                "response_format.json_schema.schema must be a JSON schema object",
                "body.response_format",
            )
        return schema


# The tools of a line are checked as an inbox row's are (kimi_batch.inputs.tools).
_Function = ToolFunction
_Tool = FunctionTool


def check_stops(value: str | list[str] | None) -> str | list[str] | None:
    stops = [value] if isinstance(value, str) else value or []
    if len(stops) > 4 or not all(stops):
        raise ValueError("stop takes at most 4 non-empty strings")
    return value


def check_logit_bias(value: dict[str, float] | None) -> dict[str, float] | None:
    for token, bias in (value or {}).items():
        if not token.isdigit() or not -100 <= bias <= 100:
            raise ValueError("logit_bias maps token ids to biases in [-100, 100]")
    return value


class _SamplingBody(_Model):
    """The fields both endpoints take."""

    model: str | None = None
    max_tokens: int | None = Field(default=None, gt=0, le=_INT64_MAX, strict=True)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=-_INT64_MAX - 1, le=_INT64_MAX, strict=True)
    n: int | None = Field(default=None, ge=1, le=1, description="One choice per request.")
    stream: Literal[False] | None = None
    stop: str | list[str] | None = None
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None

    _stops = field_validator("stop")(check_stops)
    _biases = field_validator("logit_bias")(check_logit_bias)

    def sampling(self, *, max_tokens: int, n_probs: int, **rest: Any) -> SamplingParams:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=_DEFAULT_TEMPERATURE if self.temperature is None else self.temperature,
            top_p=_DEFAULT_TOP_P if self.top_p is None else self.top_p,
            seed=self.seed,
            n_probs=n_probs,
            stop=[self.stop] if isinstance(self.stop, str) else self.stop or None,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            logit_bias=self.logit_bias,
            **rest,
        )


class _ChatBody(_SamplingBody):
    messages: list[_Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, gt=0, le=_INT64_MAX, strict=True)
    response_format: _ResponseFormat | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20, strict=True)
    tools: list[_Tool] | None = Field(default=None, min_length=1, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | None = None
    parallel_tool_calls: bool | None = None

    def tool_fields(self) -> dict[str, Any]:
        """The tool fields as sampling params take them (none without `tools`, as OpenAI)."""
        if self.tools is None:
            for name in ("tool_choice", "parallel_tool_calls"):
                if getattr(self, name) is not None:
                    raise LineRefusedError(f"{name} is only allowed with tools", f"body.{name}")
            return {}
        return {
            "tools": [tool.model_dump(exclude_none=True) for tool in self.tools],
            "tool_choice": self.tool_choice,
            "parallel_tool_calls": self.parallel_tool_calls,
        }


class _CompletionBody(_SamplingBody):
    prompt: str = Field(min_length=1)
    logprobs: int | None = Field(default=None, ge=0, le=5, strict=True)
    echo: Literal[False] | None = None
    best_of: int | None = Field(default=None, ge=1, le=1)


class _TextFormat(_Nested):
    """The Responses API's `text.format`: the same three kinds, the schema at its top level."""

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None

    def response_format(self) -> _ResponseFormat:
        if self.type != "json_schema":
            if self.schema_ is not None:
                raise LineRefusedError(
                    f"text.format.schema is only used with type 'json_schema', not {self.type!r}",
                    "body.text.format.schema",
                )
            return _ResponseFormat(type=self.type)
        schema = _JsonSchema.model_validate({"schema": self.schema_})
        return _ResponseFormat(type=self.type, json_schema=schema)


class _Text(_Nested):
    """The Responses API's `text`; `verbosity` is refused (llama-server has no such control)."""

    format: _TextFormat | None = None


class _FlatTool(BaseModel):
    """A Responses function tool: the function's fields beside `type`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["function"]
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    def chat_tool(self) -> _Tool:
        return _Tool(type="function", function=_Function(**self.model_dump(exclude={"type"})))


class _ResponsesBody(_SamplingBody):
    input: list[_InputItem] = Field(min_length=1)
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, gt=0, le=_INT64_MAX, strict=True)
    text: _Text | None = None
    tools: list[_FlatTool] | None = Field(default=None, min_length=1, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | None = None
    parallel_tool_calls: bool | None = None

    @field_validator("input", mode="before")
    @classmethod
    def _one_user_turn(cls, value: Any) -> Any:
        """A string input is one user message (the Responses API's shorthand)."""
        return [{"role": "user", "content": value}] if isinstance(value, str) else value

    def chat_body(self) -> _ChatBody:
        """The chat request llama-server's /v1/responses would make of this body."""
        system = [_Message(role="system", content=self.instructions)] if self.instructions else []
        text_format = self.text.format if self.text else None
        return _ChatBody(
            messages=[*system, *(_Message(role=i.role, content=i.content) for i in self.input)],
            max_tokens=self.max_output_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            response_format=text_format.response_format() if text_format else None,
            tools=[tool.chat_tool() for tool in self.tools] if self.tools else None,
            tool_choice=self.tool_choice,
            parallel_tool_calls=self.parallel_tool_calls,
        )


def _no_nul(value: str) -> str:
    # PostgreSQL text cannot hold U+0000: a custom_id holding one could not be recorded.
    if "\x00" in value:
        at = value.index("\x00")
        raise ValueError(f"must not contain U+0000 (a NUL character; at character {at})")
    return value


class _Line(_Model):
    custom_id: str = Field(min_length=1)
    method: Literal["POST"]
    url: str

    _custom_id = field_validator("custom_id")(_no_nul)


class _ChatLine(_Line):
    body: _ChatBody


class _CompletionLine(_Line):
    body: _CompletionBody


def _split_system(messages: Sequence[_Message], field: str) -> tuple[str, list[ChatMessage]]:
    """The leading system text and the turns after it; `field` names the turns' body field in
    a refusal (`body.messages`, or a Responses line's `body.input`)."""
    head = 0
    while head < len(messages) and messages[head].role in ("system", "developer"):
        head += 1
    rest = messages[head:]
    if any(m.role in ("system", "developer") for m in rest):
        raise LineRefusedError("a system message is only supported before the conversation", field)
    if not rest or rest[-1].role != "user":
        raise LineRefusedError("the last message must be from the user", field)
    system = "\n\n".join(m.content for m in messages[:head])
    turns = [
        ChatMessage(role="user" if m.role == "user" else "assistant", content=m.content)
        for m in rest
    ]
    return system, turns


class _ResponsesLine(_Line):
    body: _ResponsesBody


def _chat_line(record: dict[str, Any], number: int) -> BatchRequestLine:
    line = _ChatLine.model_validate(record)
    return _chat_request(line.custom_id, line.body, number)


def _responses_line(record: dict[str, Any], number: int) -> BatchRequestLine:
    line = _ResponsesLine.model_validate(record)
    request = _chat_request(line.custom_id, line.body.chat_body(), number, turns="body.input")
    return request.model_copy(update={"kind": "responses"})


def _chat_request(
    custom_id: str, body: _ChatBody, number: int, *, turns: str = "body.messages"
) -> BatchRequestLine:
    """`turns`: the body field the conversation came from, named in a refusal."""
    system, messages = _split_system(body.messages, turns)
    format_ = body.response_format
    top = (body.top_logprobs or 0) if body.logprobs else None
    params = body.sampling(
        max_tokens=body.max_completion_tokens or body.max_tokens or _DEFAULT_CHAT_MAX_TOKENS,
        # Token logprobs come with at least one alternative from llama-server; the output
        # lists as many as were asked for.
        n_probs=max(top, 1) if top is not None else 0,
        json_schema=format_.schema_or_none() if format_ else None,
        **body.tool_fields(),
    )
    return BatchRequestLine(
        custom_id=custom_id,
        line=number,
        system=system,
        messages=messages,
        params=params,
        top_logprobs=top,
    )


def _completion_line(record: dict[str, Any], number: int) -> BatchRequestLine:
    line = _CompletionLine.model_validate(record)
    body = line.body
    top = body.logprobs
    params = body.sampling(
        max_tokens=body.max_tokens or _DEFAULT_COMPLETION_MAX_TOKENS,
        n_probs=max(top, 1) if top is not None else 0,
    )
    return BatchRequestLine(
        custom_id=line.custom_id,
        line=number,
        system="",  # a raw prompt has no system turn: nothing goes in front of it
        messages=[ChatMessage(role="user", content=body.prompt)],
        params=params,
        top_logprobs=top,
        kind="completion",
    )


_READERS = {"chat": _chat_line, "completion": _completion_line, "responses": _responses_line}


def request_line(record: dict[str, Any], number: int, kind: LineKind) -> BatchRequestLine:
    """The request of input line `number` (`record`, its JSON object) of a batch whose lines
    are of `kind`. Raises pydantic's ValidationError or `LineRefusedError`."""
    return _READERS[kind](record, number)


def body_fields(kind: LineKind) -> frozenset[str]:
    """The body fields the model of a `kind` line declares (by their JSON names)."""
    model = {"chat": _ChatBody, "completion": _CompletionBody, "responses": _ResponsesBody}[kind]
    return frozenset(field.alias or name for name, field in model.model_fields.items())
