"""OpenAI Batch API lines, read and written: an input file validated as it streams into
requests (`BatchRequestLine`s, or `BatchLineError`s), and the output and error lines; each of the
three endpoints' lines (chat, completion, Responses) read and answered in its own shape.

A batch is answered exactly as submitted: a chat line's leading system (or developer) message is
the batch's own digest (prefilled once, saved and restored into every slot, like the
pipeline's), the other messages are sent as they are, and the body's fields become the
request's params. A completion line (`/v1/completions`) is a raw prompt, sent as it is: no
digest, no chat template.

**Input** (`/v1/batches`): one JSON object a line, `{custom_id, method, url, body}`. Validation
is all or nothing, as OpenAI's: one bad line fails the batch with errors naming it (the first
`MAX_LISTED_ERRORS` listed, all counted). A batch runs the request it was given, or none: a
field this server would not apply is refused with the line and the field named
(`unsupported_field`), never dropped, and so is a `model` it does not serve (`model_not_found`).

**The bodies, as models.** `_ChatBody` (`/v1/chat/completions`: messages, response format,
tools), `_CompletionBody` (`/v1/completions`: one raw prompt) and `_ResponsesBody`
(`/v1/responses`: instructions and input items, run as the chat request llama-server's own
/v1/responses makes of them) share the fields every endpoint takes (`_BaseBody`: `model`,
`temperature`, `top_p`, `stream`); chat and completion lines also take the other sampling fields
(`_SamplingBody`). Unset values take OpenAI's defaults (temperature 1, top_p 1; a completion's
max_tokens 16, a chat or Responses answer's as long as the server allows). `request_line` turns
a line that validates into its `BatchRequestLine`, or raises (`LineRefusedError` names the field
of a line that validates as models but asks for what is not served).

**The fields a body may hold** (`refused_field`, checked before the models are built) are what
its model declares (`body_fields`) and the bookkeeping OpenAI keeps, accepted and not sent
because it does not change the answer: `user`, `metadata`, `store`, and `stream: false`.

- Chat lines pass through to llama-server: the sampling fields (`max_tokens`/
  `max_completion_tokens`, `temperature`, `top_p`, `seed`, `stop`, `presence_penalty`,
  `frequency_penalty`, `logit_bias`), `response_format`, `logprobs`/`top_logprobs`, and the
  tools (`tools`, `tool_choice` as `none`/`auto`/`required`, `parallel_tool_calls`: the bundled
  server renders them with the model's chat template, its `--jinja` default, and the answer's
  tool calls reach the output line; a server whose template renders no tools gets no such
  request, the client refuses it in the run). Refused: a `tool_choice` naming a function
  (llama-server reads only the three strings and would quietly run `auto`), the older
  `functions`/`function_call` (llama-server ignores them), and messages holding tool calls or
  tool results (a conversation is text turns here).
- Completion lines pass through `prompt` (one string), the same sampling fields (`max_tokens`),
  and `logprobs` (an integer); `echo` only as false and `best_of` only as 1 (llama-server
  applies neither), `suffix` is refused (it would be ignored).
- Responses lines: `instructions` (the system turn), `input` (a string, or message items of
  text parts), `max_output_tokens`, `temperature`, `top_p`, `text.format` (text, json_object,
  json_schema), and function `tools` (flat, as the Responses API writes them) with
  `tool_choice` and `parallel_tool_calls`. Refused: `previous_response_id` (no response is
  stored here: a line stands alone), input items other than messages, and every other field.

Inside the fields, every object is a model that refuses a key it does not list
(`text.verbosity`, a misspelt `text.fromat`, `response_format.schema`), named by its path; only
a JSON schema and a tool's `parameters` are free-form, and they are sent as given. All: `n` only
as 1 (one choice per request).

**The file** is read line by line with the pipeline's own JSONL reader (`inputs.jsonl_items`:
bounded lines, bad UTF-8, deep nesting and over-long integers become line errors there), and
nothing but the `custom_id` index (8-byte digests, `SeenIds`) outlives a line: `scan_batch_input`
holds one line at a time whatever the file's size. Whatever a line makes the parser or the
models raise is that line's error, never an exception out of here. So is a number strict JSON
(OpenAI's, and the request sent in the run) has no spelling for, which Python's reader takes:
`NaN`, `Infinity`, `-Infinity`, or one too large for a double (`invalid_json_line`, naming
where it is). At most `max_requests` requests (OpenAI's 50,000; the API passes the
deployment's limit to every read, the run's included); the line past it fails the batch and
ends the read.

**Output**: one writer (`response_line`, `error_line`) for the API's output and error files and
for `kimi-batch export`: a `chat.completion` body (tool calls included) for a chat line, a
`text_completion` body for a completion line, a `response` object for a Responses line (run as
the chat request llama-server's own /v1/responses would make of it), as OpenAI's batch output
has them.
"""

from __future__ import annotations

import io
import itertools
import json
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from typing import IO, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from kimi_batch.engine import GenerationRequest, GenerationResult, RequestKind, SamplingParams
from kimi_batch.inputs import (
    MAX_ROW_BYTES,
    FunctionTool,
    Item,
    SeenIds,
    ToolFunction,
    format_validation_error,
    jsonl_items,
    number_spelling,
)
from kimi_batch.llama import ChatMessage, TokenLogprob, ToolCall
from kimi_batch.pipeline import RequestTag
from kimi_batch.settings import DEFAULT_API_MAX_BATCH_REQUESTS, Settings

CHAT_COMPLETIONS_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"
RESPONSES_URL = "/v1/responses"
LineKind = Literal["chat", "completion", "responses"]
"""What a batch's lines are: the shape they are read in and answered in."""
BATCH_ENDPOINTS: dict[str, LineKind] = {
    CHAT_COMPLETIONS_URL: "chat",
    COMPLETIONS_URL: "completion",
    RESPONSES_URL: "responses",
}
"""The endpoints a batch may name, and the kind of line each holds."""
# A Responses line runs as a chat request (instructions as the system turn, input items as the
# turns), which is what llama-server's own /v1/responses does with it.
_REQUEST_KIND: dict[LineKind, RequestKind] = {
    "chat": "chat",
    "completion": "completion",
    "responses": "chat",
}
API_STAGE = "api"
MAX_LISTED_ERRORS = 100


class BatchLineError(BaseModel):
    """One validation error of a batch input, in OpenAI's `errors.data[]` shape."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    code: str
    message: str
    param: str | None = None
    line: int | None = Field(default=None, description="1-based line of the input file.")


class BatchRequestLine(BaseModel):
    """A validated input line: the batch's system text (its digest), the rest, the params."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    custom_id: str = Field(min_length=1)
    line: int = Field(ge=1)
    system: str = Field(description="Leading system/developer text; '' when there is none.")
    messages: list[ChatMessage] = Field(
        min_length=1, description="After the system, as sent (a completion: its raw prompt)."
    )
    params: SamplingParams
    top_logprobs: int | None = Field(description="None: logprobs not asked for.")
    kind: LineKind = Field(default="chat", description="The batch endpoint's kind of line.")

    @property
    def prompt(self) -> str:
        """The last user message, or the raw prompt (the `prompt` column of the distilled row)."""
        return self.messages[-1].content

    def request(self) -> GenerationRequest:
        return GenerationRequest(
            input_id=self.custom_id,
            messages=self.messages,
            params=self.params,
            tag=RequestTag(stage=API_STAGE).wire,
            kind=_REQUEST_KIND[self.kind],
        )


class BatchInput(BaseModel):
    """A batch input file read whole: its valid lines, or why it does not validate."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lines: list[BatchRequestLine]
    errors: list[BatchLineError]
    error_count: int = Field(ge=0, description="All errors; `errors` lists the first ones.")


# ---- the input: each line's body as models ---------------------------------------------------


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
    # Unknown fields are refused before these models are built (`refused_field`).
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
            # One line apart, as llama-server joins a message's text parts for a template that
            # takes a string (and as the inbox's rows are read): "".join ran words together.
            return "\n".join(_part_text(index, part) for index, part in enumerate(value))
        return value


class _InputItem(_Message):
    """A Responses input item: a message (`type` "message" or absent), text parts only. A
    response's own output message passed back (OpenAI's way to go on with a conversation)
    carries its `id` and `status` too: bookkeeping, no part of the prompt."""

    type: Literal["message"] = "message"
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


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
        if not (token.isascii() and token.isdigit()) or not -100 <= bias <= 100:
            raise ValueError("logit_bias maps token ids to biases in [-100, 100]")
    return value


class _BaseBody(_Model):
    """The fields every endpoint takes."""

    model: str | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stream: Literal[False] | None = None


class _SamplingBody(_BaseBody):
    """The sampling fields a chat or completion line takes (the Responses API has no others)."""

    max_tokens: int | None = Field(default=None, gt=0, le=_INT64_MAX, strict=True)
    seed: int | None = Field(default=None, ge=-_INT64_MAX - 1, le=_INT64_MAX, strict=True)
    n: int | None = Field(default=None, ge=1, le=1, description="One choice per request.")
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


class _ResponsesBody(_BaseBody):
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
    if body.top_logprobs is not None and not body.logprobs:
        # OpenAI answers it with a 400; dropping it would run a request without what it asked.
        raise LineRefusedError(
            "top_logprobs is only allowed with logprobs: true", "body.top_logprobs"
        )
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


_BODIES: dict[LineKind, type[_BaseBody]] = {
    "chat": _ChatBody,
    "completion": _CompletionBody,
    "responses": _ResponsesBody,
}


def _declared(model: type[BaseModel]) -> frozenset[str]:
    """The fields `model` declares, by their JSON names."""
    return frozenset(field.alias or name for name, field in model.model_fields.items())


def body_fields(kind: LineKind) -> frozenset[str]:
    """The body fields the model of a `kind` line declares (by their JSON names)."""
    return _declared(_BODIES[kind])


# Bookkeeping OpenAI keeps; no effect on the answer.
_BOOKKEEPING = frozenset({"user", "metadata", "store", "stream"})
# A line may hold what its body model declares, and the bookkeeping.
ACCEPTED_BODY_FIELDS: dict[LineKind, frozenset[str]] = {
    kind: body_fields(kind) | _BOOKKEEPING for kind in _BODIES
}
_MESSAGE_FIELDS = _declared(_Message)
_INPUT_ITEM_FIELDS = _declared(_InputItem)
_WHY: dict[str, str] = {
    "functions": "is not supported: llama-server does not apply the deprecated "
    "functions/function_call; send them as tools/tool_choice",
    "suffix": "is not supported: llama-server's /v1/completions does not insert a suffix",
    "tool_calls": "is not supported here: a conversation is text turns (a model's tool calls "
    "come back in the output line; a line carrying them or their results cannot be sent)",
}
_WHY["previous_response_id"] = (
    "is not supported: no response is stored here, so a line stands alone (send the whole "
    "conversation as input items)"
)
_WHY["function_call"] = _WHY["functions"]
_WHY["tool_call_id"] = _WHY["tool_calls"]


def _refused_value(body: dict[Any, Any], kind: LineKind) -> tuple[str, str] | None:
    """A field accepted only with OpenAI's default, or in one shape, holding another value."""
    n, best_of = body.get("n"), body.get("best_of")
    if isinstance(n, int) and not isinstance(n, bool) and n > 1:
        return "body.n", "must be 1: llama-server answers one choice per request"
    if isinstance(best_of, int) and not isinstance(best_of, bool) and best_of > 1:
        return "body.best_of", "must be 1: llama-server samples one answer per request"
    if body.get("echo") is True:
        return "body.echo", "must be false: llama-server does not echo the prompt"
    if kind == "completion" and isinstance(body.get("prompt"), list):
        return "body.prompt", (
            "must be one string: a list of prompts or token ids is not supported (one line "
            "per prompt)"
        )
    if kind == "responses":
        refused = _refused_responses_value(body)
        if refused is not None:
            return refused
    if isinstance(body.get("tool_choice"), dict):
        return "body.tool_choice", (
            "must be 'none', 'auto' or 'required': llama-server does not force a named "
            "function (send only that tool, with 'required')"
        )
    return None


def _refused_responses_value(body: dict[Any, Any]) -> tuple[str, str] | None:
    """A Responses input item that is not a message, or a tool that is not a function."""
    items = body.get("input")
    for index, item in enumerate(items if isinstance(items, list) else []):
        kind = item.get("type", "message") if isinstance(item, dict) else "message"
        if kind != "message":
            return f"body.input.{index}.type", (
                f"{str(kind)[:100]!r} is not supported: input items are messages of text here "
                "(no tool calls or their outputs, files or images)"
            )
    tools = body.get("tools")
    for index, tool in enumerate(tools if isinstance(tools, list) else []):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            return f"body.tools.{index}.type", (
                f"{str(kind)[:100]!r} is not supported: llama-server runs function tools only "
                "(no built-in tools)"
            )
    return None


def refused_field(body: Any, kind: LineKind = "chat") -> tuple[str, str] | None:
    """(param, why) of the first field of `body` this server would not apply to a request of
    `kind`; None if none."""
    if not isinstance(body, dict):
        return None
    accepted = ACCEPTED_BODY_FIELDS[kind]
    for name in body:
        if name not in accepted:
            why = _WHY.get(name, "is not supported by this server")
            return f"body.{str(name)[:100]}", why
    refused = _refused_value(body, kind)
    if refused is not None:
        return refused
    field, allowed = (
        ("input", _INPUT_ITEM_FIELDS) if kind == "responses" else ("messages", _MESSAGE_FIELDS)
    )
    messages = body.get(field)
    for index, message in enumerate(messages if isinstance(messages, list) else []):
        for name in message if isinstance(message, dict) else ():
            if name not in allowed:
                why = _WHY.get(name, "is not supported here")
                return f"body.{field}.{index}.{str(name)[:100]}", why
    return None


def served_models(settings: Settings) -> frozenset[str] | None:
    """The names a line's `model` may take, lowercased: the configured model file's stem (the
    `--alias` the resident server is started with), its file name and the aliases of any
    `-a`/`--alias` in `KIMI_BATCH_LLAMA_EXTRA_ARGS` (llama-server takes a comma-separated
    list). None (any name) for an attached server or no model: the name it serves is known
    only to it, and validation runs without a server."""
    if settings.llama_url or settings.model is None:
        return None
    names = {settings.model.name, settings.model.name.removesuffix(".gguf")}
    for flag, value in itertools.pairwise(settings.llama_extra_args):
        if flag in ("-a", "--alias"):
            names.update(alias.strip() for alias in value.split(",") if alias.strip())
    return frozenset(name.lower() for name in names)


def model_not_served(body: Any, models: frozenset[str] | None) -> str | None:
    """Why the line's `model` is not served; None when it is, or is absent (optional here)."""
    name = body.get("model") if isinstance(body, dict) else None
    if models is None or name is None or (isinstance(name, str) and name.lower() in models):
        return None
    served = ", ".join(sorted(models)) or "none"
    return f"the model {str(name)[:200]!r} does not exist here (served: {served})"


# OpenAI's limit per batch; the default of `max_requests`. The API's validation passes
# `settings.api_max_batch_requests` (KIMI_BATCH_API_MAX_BATCH_REQUESTS).
MAX_BATCH_REQUESTS = DEFAULT_API_MAX_BATCH_REQUESTS
# The pipeline's row bound (~250k tokens, more than a slot's context on the target).
MAX_BATCH_LINE_BYTES = MAX_ROW_BYTES
# Deeper than any chat request or JSON schema needs; a deeper value could overflow the
# serializers that hash and send the request later, in the run.
MAX_NESTING = 64


class BatchScan(BaseModel):
    """What validating a batch input found: its request count, or why it does not validate."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    request_total: int = Field(ge=0)
    errors: list[BatchLineError]
    error_count: int = Field(ge=0, description="All errors; `errors` lists the first ones.")


def _param(error: ValidationError) -> str | None:
    first = error.errors()[0]["loc"] if error.error_count() else ()
    return ".".join(str(part) for part in first) or None


def _json_flaw(record: dict[str, Any], limit: int) -> tuple[str, str | None] | None:
    """What `record` holds that no request may: containers nested deeper than `limit`, or a
    number strict JSON has no room for (`inputs.number_spelling`); (the message, the path of the
    number), the nesting first; None if neither.

    Python's JSON reader takes `NaN`, `Infinity` and `-Infinity` (and reads `1e999` as infinity)
    and integers of any size, but the request a line becomes is sent as strict JSON, which has no
    such numbers (llama-server refuses an integer past a double's range): found
    only in the run, one would fail the whole batch (or turn into null inside a tool's
    `parameters`). One walk for both, iterative (a line nested past the recursion limit must not
    crash the check); a path is built only for the containers."""
    non_finite: tuple[str, str | None] | None = None
    stack: list[tuple[dict[str, Any] | list[Any], int, str]] = [(record, 1, "")]
    while stack:
        node, depth, path = stack.pop()
        if depth > limit:
            return f"nested deeper than {limit} levels", None
        children = node.items() if isinstance(node, dict) else enumerate(node)
        for key, child in children:
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1, f"{path}{str(key)[:100]}."))
            elif non_finite is None and (spelling := number_spelling(child)) is not None:
                where = f"{path}{str(key)[:100]}"
                non_finite = (
                    f"{where} is {spelling}, which is not valid JSON (a number must be "
                    "finite: no NaN, Infinity, or a value too large for a double)",
                    where,
                )
    return non_finite


# ---- the streaming validator -----------------------------------------------------------------


class BatchValidator:
    """Checks one line after another; keeps the custom_id index, the request count and the
    first errors, nothing of a line once it is checked."""

    def __init__(
        self,
        *,
        endpoint: str,
        max_requests: int = MAX_BATCH_REQUESTS,
        models: frozenset[str] | None = None,
    ) -> None:
        if endpoint not in BATCH_ENDPOINTS:
            raise ValueError(f"no batch endpoint {endpoint!r}")
        self.endpoint = endpoint
        self.kind: LineKind = BATCH_ENDPOINTS[endpoint]
        self.models = models
        self.max_requests = max_requests
        self.requests = 0
        self.errors: list[BatchLineError] = []
        self.error_count = 0
        self.full = False  # the request limit was passed: the rest of the file is not read
        self._lines = 0
        self._seen = SeenIds()

    def _fail(self, code: str, message: str, number: int, param: str | None = None) -> None:
        self.error_count += 1
        if len(self.errors) < MAX_LISTED_ERRORS:
            self.errors.append(BatchLineError(code=code, message=message, param=param, line=number))

    def check(self, item: Item) -> BatchRequestLine | None:
        """The line's request, or None (its error recorded)."""
        number = item.line or 0
        self._lines += 1
        if self._lines > self.max_requests:
            self.full = True
            self._fail(
                "too_many_requests",
                f"line {number}: a batch holds at most {self.max_requests} requests; "
                "split the file into several batches",
                number,
            )
            return None
        if item.error is not None:
            self._fail("invalid_json_line", f"line {number}: {item.error}", number)
            return None
        record = item.record
        if not isinstance(record, dict):
            self._fail("invalid_json_line", f"line {number} is not a JSON object", number)
            return None
        if (flaw := _json_flaw(record, MAX_NESTING)) is not None:
            message, path = flaw
            self._fail("invalid_json_line", f"line {number}: {message}", number, path)
            return None
        if record.get("url") != self.endpoint:
            self._fail(
                "invalid_url",
                f"line {number}: url {str(record.get('url'))[:200]!r} does not match the "
                f"batch's endpoint {self.endpoint!r}",
                number,
                "url",
            )
            return None
        request = self._request(record, number)
        if request is None:
            return None
        if not self._seen.add(request.custom_id, number):
            first = self._seen.first_line(request.custom_id)
            self._fail(
                "duplicate_custom_id",
                f"line {number}: custom_id {request.custom_id[:200]!r} is already used on line "
                f"{first}",
                number,
                "custom_id",
            )
            return None
        self.requests += 1
        return request

    def _request(self, record: dict[str, Any], number: int) -> BatchRequestLine | None:
        """The request a line's body asks for, or None (its error recorded): fields this
        server would not honour, a model it does not serve, invalid values."""
        refused = refused_field(record.get("body"), self.kind)
        if refused is not None:
            param, why = refused
            self._fail("unsupported_field", f"line {number}: {param} {why}", number, param)
            return None
        model = model_not_served(record.get("body"), self.models)
        if model is not None:
            self._fail("model_not_found", f"line {number}: {model}", number, "body.model")
            return None
        try:
            request = request_line(record, number, self.kind)
            # What the run hashes and sends must serialize (a lone surrogate would not).
            request.model_dump_json()
        except ValidationError as error:
            reason = format_validation_error(error)
            self._fail("invalid_request", f"line {number}: {reason}", number, _param(error))
            return None
        except LineRefusedError as error:
            self._fail("invalid_request", f"line {number}: {error}", number, error.param)
            return None
        except (ValueError, TypeError, RecursionError, OverflowError) as error:
            # Nothing a line holds may escape as an exception: it is this line's error.
            reason = f"{type(error).__name__}: {str(error)[:200]}"
            self._fail("invalid_request", f"line {number}: {reason}", number)
            return None
        return request

    def finish(self) -> BatchScan:
        if not self.requests and not self.error_count:
            self._fail("empty_file", "the input file holds no requests", 1)
        return BatchScan(
            request_total=self.requests if not self.error_count else 0,
            errors=self.errors,
            error_count=self.error_count,
        )


def _items(source: IO[bytes] | Sequence[bytes]) -> Iterator[Item]:
    file = io.BytesIO(b"\n".join(source)) if isinstance(source, Sequence) else source
    return jsonl_items(file, max_row_bytes=MAX_BATCH_LINE_BYTES)


def _valid_lines(
    validator: BatchValidator, items: Iterator[Item], on_line: Callable[[], None] | None
) -> Iterator[BatchRequestLine]:
    for item in items:
        request = validator.check(item)
        if on_line is not None:
            on_line()
        if validator.full:
            return
        if request is not None:
            yield request


def scan_batch_input(
    file: IO[bytes],
    *,
    endpoint: str,
    max_requests: int = MAX_BATCH_REQUESTS,
    on_line: Callable[[], None] | None = None,
    models: frozenset[str] | None = None,
) -> BatchScan:
    """Validate a batch input file holding one line at a time; `on_line` runs after each.
    `models`: the names a line's `model` may take (None: any, the served name unknown)."""
    validator = BatchValidator(endpoint=endpoint, max_requests=max_requests, models=models)
    for _ in _valid_lines(validator, _items(file), on_line):
        pass
    return validator.finish()


def parse_batch_input(
    source: IO[bytes] | Sequence[bytes],
    *,
    endpoint: str,
    max_requests: int = MAX_BATCH_REQUESTS,
) -> BatchInput:
    """Validate and keep every request (the run's read of a landed, validated input; tests
    hand it lines)."""
    validator = BatchValidator(endpoint=endpoint, max_requests=max_requests)
    lines = list(_valid_lines(validator, _items(source), None))
    scan = validator.finish()
    return BatchInput(
        lines=lines if not scan.error_count else [],
        errors=scan.errors,
        error_count=scan.error_count,
    )


def iter_batch_input(
    file: IO[bytes], *, endpoint: str, max_requests: int = MAX_BATCH_REQUESTS
) -> Iterator[BatchRequestLine]:
    """The requests of a landed (validated) input one at a time, none kept: a read that must
    not hold the whole batch (its output files). ValueError at the first line that no longer
    validates."""
    validator = BatchValidator(endpoint=endpoint, max_requests=max_requests)
    for request in _valid_lines(validator, _items(file), None):
        if validator.error_count:
            break
        yield request
    scan = validator.finish()
    if scan.error_count:
        raise ValueError(f"{scan.error_count} lines no longer validate: {scan.errors[0].message}")


# ---- output ----------------------------------------------------------------------------------


class AnsweredRequest(BaseModel):
    """A finished request, whatever it was read from (a ledger result or a `distilled` row)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    custom_id: str
    request_id: str
    model: str
    created_at: datetime
    content: str
    reasoning: str | None = None
    logprobs: list[TokenLogprob] | None = None
    tool_calls: list[ToolCall] | None = None
    finish_reason: str
    prompt_tokens: int = Field(ge=0)
    completion_tokens: int = Field(ge=0)
    cached_tokens: int = Field(ge=0)

    @classmethod
    def from_result(cls, result: GenerationResult, *, custom_id: str) -> AnsweredRequest:
        return cls(
            custom_id=custom_id,
            request_id=result.request_id,
            model=result.model,
            created_at=result.created_at,
            content=result.text,
            reasoning=result.reasoning_content or None,
            logprobs=result.logprobs,
            tool_calls=result.tool_calls,
            finish_reason=result.finish_reason,
            prompt_tokens=result.prompt_tokens,
            completion_tokens=result.completion_tokens,
            cached_tokens=result.cached_tokens,
        )


def _epoch(moment: datetime) -> int:
    # Stored times are UTC; Parquet hands them back naive, and a naive `.timestamp()` would be
    # read as local time.
    aware = moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
    return int(aware.timestamp())


def _token(text: str, logprob: float) -> dict[str, Any]:
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def _logprobs(tokens: list[TokenLogprob], top_logprobs: int | None) -> dict[str, Any]:
    keep = len(tokens[0].top) if tokens and top_logprobs is None else (top_logprobs or 0)
    return {
        "content": [
            {
                **_token(t.token, t.logprob),
                "top_logprobs": [_token(a.token, a.logprob) for a in t.top[:keep]],
            }
            for t in tokens
        ],
        "refusal": None,
    }


def _text_logprobs(tokens: list[TokenLogprob], top_logprobs: int | None) -> dict[str, Any]:
    """Logprobs in the legacy completions shape: parallel lists, alternatives as a mapping."""
    keep = len(tokens[0].top) if tokens and top_logprobs is None else (top_logprobs or 0)
    offsets, offset = [], 0
    for t in tokens:
        offsets.append(offset)
        offset += len(t.token)
    return {
        "tokens": [t.token for t in tokens],
        "token_logprobs": [t.logprob for t in tokens],
        "top_logprobs": [{a.token: a.logprob for a in t.top[:keep]} for t in tokens],
        "text_offset": offsets,
    }


def _usage(answer: AnsweredRequest) -> dict[str, Any]:
    return {
        "prompt_tokens": answer.prompt_tokens,
        "completion_tokens": answer.completion_tokens,
        "total_tokens": answer.prompt_tokens + answer.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": answer.cached_tokens},
    }


def _chat_choice(answer: AnsweredRequest, top_logprobs: int | None) -> dict[str, Any]:
    # OpenAI's message of a tool-calling answer has `content: null` when it wrote no text.
    content = answer.content if answer.content or not answer.tool_calls else None
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
    if answer.tool_calls:
        message["tool_calls"] = [call.model_dump(mode="json") for call in answer.tool_calls]
    if answer.reasoning:
        message["reasoning_content"] = answer.reasoning
    return {
        "index": 0,
        "message": message,
        "logprobs": _logprobs(answer.logprobs, top_logprobs) if answer.logprobs else None,
        "finish_reason": answer.finish_reason,
    }


def _tool_echo(params: SamplingParams | None) -> dict[str, Any]:
    """The request's tool fields as a `response` object echoes them (OpenAI's defaults when
    unset); the tools back in the Responses shape, the function's fields beside `type`."""
    tools = (params.tools if params else None) or []
    return {
        "parallel_tool_calls": params is None or params.parallel_tool_calls is not False,
        "tool_choice": (params.tool_choice if params else None) or "auto",
        "tools": [{"type": "function", **tool["function"]} for tool in tools],
    }


def _response_object(answer: AnsweredRequest, params: SamplingParams | None) -> dict[str, Any]:
    """A Responses API `response` body: its text as one message item, then its tool calls."""
    output: list[dict[str, Any]] = []
    if answer.content or not answer.tool_calls:
        text = {"type": "output_text", "text": answer.content, "annotations": []}
        output.append(
            {
                "type": "message",
                "id": f"msg_{answer.request_id}",
                "status": "completed",
                "role": "assistant",
                "content": [text],
            }
        )
    for call in answer.tool_calls or []:
        output.append(
            {
                "type": "function_call",
                "id": f"fc_{call.id}",
                "call_id": call.id,
                "name": call.function.name,
                "arguments": call.function.arguments,
                "status": "completed",
            }
        )
    cut_off = answer.finish_reason == "length"
    return {
        "id": f"resp_{answer.request_id}",
        "object": "response",
        "created_at": _epoch(answer.created_at),
        "status": "incomplete" if cut_off else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut_off else None,
        "error": None,
        "model": answer.model,
        "output": output,
        **_tool_echo(params),
        "usage": {
            "input_tokens": answer.prompt_tokens,
            # What the server did not find in its cache it evaluated and kept in the slot.
            "input_tokens_details": {
                "cached_tokens": answer.cached_tokens,
                "cache_write_tokens": max(0, answer.prompt_tokens - answer.cached_tokens),
            },
            "output_tokens": answer.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": answer.prompt_tokens + answer.completion_tokens,
        },
    }


def _completion_object(answer: AnsweredRequest, top_logprobs: int | None) -> dict[str, Any]:
    logprobs = answer.logprobs
    choice: dict[str, Any] = {
        "text": answer.content,
        "index": 0,
        "logprobs": _text_logprobs(logprobs, top_logprobs) if logprobs else None,
        "finish_reason": answer.finish_reason,
    }
    return {
        "id": f"cmpl-{answer.request_id}",
        "object": "text_completion",
        "created": _epoch(answer.created_at),
        "model": answer.model,
        "choices": [choice],
        "usage": _usage(answer),
    }


def _chat_completion_object(answer: AnsweredRequest, top_logprobs: int | None) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{answer.request_id}",
        "object": "chat.completion",
        "created": _epoch(answer.created_at),
        "model": answer.model,
        "choices": [_chat_choice(answer, top_logprobs)],
        "usage": _usage(answer),
    }


def response_line(
    answer: AnsweredRequest,
    *,
    top_logprobs: int | None = None,
    kind: LineKind = "chat",
    params: SamplingParams | None = None,
) -> str:
    """The output-file line of a finished request, as OpenAI returns it for the batch's kind
    of line: a `chat.completion`, a `text_completion`, or a `response` object.

    `top_logprobs`: how many alternatives the request asked for (None: all that were kept).
    `params`: the request's sampling params, whose tool fields a `response` object echoes.
    An answer cut off at max_tokens is a success with `finish_reason: "length"` (a Responses
    answer: `status: "incomplete"`, reason `max_output_tokens`).
    """
    if kind == "completion":
        body = _completion_object(answer, top_logprobs)
    elif kind == "responses":
        body = _response_object(answer, params)
    else:
        body = _chat_completion_object(answer, top_logprobs)
    return json.dumps(
        {
            "id": f"batch_req_{answer.request_id}",
            "custom_id": answer.custom_id,
            "response": {"status_code": 200, "request_id": answer.request_id, "body": body},
            "error": None,
        },
        ensure_ascii=False,
    )


def error_line(*, custom_id: str, request_id: str | None, code: str, message: str) -> str:
    """The error-file line of a request that failed or was set aside (the reason as message)."""
    return json.dumps(
        {
            "id": f"batch_req_{request_id or custom_id}",
            "custom_id": custom_id,
            "response": None,
            "error": {"code": code, "message": message},
        },
        ensure_ascii=False,
    )
