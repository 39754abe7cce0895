"""OpenAI Batch API lines: the input a batch is validated from, and the output and error lines.

Input (`/v1/batches`): one JSON object a line, `{custom_id, method, url, body}`, `body` a chat
completion request. A batch is answered exactly as submitted: its leading system (or developer)
message is the batch's own digest (prefilled once, saved and restored into every slot, like the
pipeline's), the other messages are sent as they are, and `max_tokens` (or
`max_completion_tokens`), `temperature`, `top_p`, `seed`, `response_format` (JSON schema or
object) and `logprobs`/`top_logprobs` become the request's sampling params. Unset values take
OpenAI's defaults (temperature 1, top_p 1). Validation is all or nothing, as OpenAI's: one bad
line (not JSON, a wrong `url`, a duplicate `custom_id`) fails the batch with errors naming it.

Output: one writer (`response_line`, `error_line`) for the API's output and error files and for
`kimi-batch export`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from kimi_batch.engine import GenerationRequest, GenerationResult, SamplingParams
from kimi_batch.llama import ChatMessage, TokenLogprob
from kimi_batch.tasks.raw_rows import format_validation_error
from kimi_batch.tasks.tags import RequestTag

__all__ = [
    "API_STAGE",
    "CHAT_COMPLETIONS_URL",
    "MAX_LISTED_ERRORS",
    "AnsweredRequest",
    "BatchInput",
    "BatchLineError",
    "BatchRequestLine",
    "error_line",
    "parse_batch_input",
    "response_line",
]

CHAT_COMPLETIONS_URL = "/v1/chat/completions"
API_STAGE = "api"
MAX_LISTED_ERRORS = 100
# OpenAI's chat completion defaults; max_tokens unset means "as long as the server allows"
# (the engine clamps it to the server's n_predict).
_DEFAULT_MAX_TOKENS = 1 << 20
_DEFAULT_TEMPERATURE = 1.0
_DEFAULT_TOP_P = 1.0


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
    messages: list[ChatMessage] = Field(min_length=1, description="After the system, as sent.")
    params: SamplingParams
    top_logprobs: int | None = Field(description="None: logprobs not asked for.")

    @property
    def prompt(self) -> str:
        """The last user message (the `prompt` column of the distilled row)."""
        return self.messages[-1].content

    def request(self) -> GenerationRequest:
        return GenerationRequest(
            input_id=self.custom_id,
            messages=self.messages,
            params=self.params,
            tag=RequestTag(stage=API_STAGE).wire,
        )


class BatchInput(BaseModel):
    """A batch input file: its valid lines, or why it does not validate."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lines: list[BatchRequestLine]
    errors: list[BatchLineError]
    error_count: int = Field(ge=0, description="All errors; `errors` lists the first ones.")


# ---- the boundary: what a client may send ------------------------------------------------


class _Message(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    role: Literal["system", "developer", "user", "assistant"]
    content: str

    @field_validator("content", mode="before")
    @classmethod
    def _parts(cls, value: Any) -> Any:
        if isinstance(value, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" for p in value):
                raise ValueError("only text content parts are supported")
            return "".join(str(p.get("text", "")) for p in value)
        return value


class _ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None

    def schema_or_none(self) -> dict[str, Any] | None:
        if self.type == "text":
            return None
        if self.type == "json_object":
            return {"type": "object"}
        schema = (self.json_schema or {}).get("schema")
        if not isinstance(schema, dict):
            raise ValueError("response_format.json_schema.schema must be a JSON schema object")
        return schema


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    messages: list[_Message] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, gt=0, strict=True)
    max_completion_tokens: int | None = Field(default=None, gt=0, strict=True)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    seed: int | None = Field(default=None, strict=True)
    response_format: _ResponseFormat | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20, strict=True)
    n: int | None = Field(default=None, ge=1, le=1, description="One choice per request.")
    stream: Literal[False] | None = None


class _Line(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    custom_id: str = Field(min_length=1)
    method: Literal["POST"]
    url: str
    body: _Body


def _split_system(messages: Sequence[_Message]) -> tuple[str, list[ChatMessage]]:
    head = 0
    while head < len(messages) and messages[head].role in ("system", "developer"):
        head += 1
    rest = messages[head:]
    if any(m.role in ("system", "developer") for m in rest):
        raise ValueError("a system message is only supported before the conversation")
    if not rest or rest[-1].role != "user":
        raise ValueError("the last message must be from the user")
    system = "\n\n".join(m.content for m in messages[:head])
    turns = [
        ChatMessage(role="user" if m.role == "user" else "assistant", content=m.content)
        for m in rest
    ]
    return system, turns


def _request_line(line: _Line, number: int) -> BatchRequestLine:
    body = line.body
    system, messages = _split_system(body.messages)
    format_ = body.response_format
    top = (body.top_logprobs or 0) if body.logprobs else None
    params = SamplingParams(
        max_tokens=body.max_completion_tokens or body.max_tokens or _DEFAULT_MAX_TOKENS,
        temperature=_DEFAULT_TEMPERATURE if body.temperature is None else body.temperature,
        top_p=_DEFAULT_TOP_P if body.top_p is None else body.top_p,
        seed=body.seed,
        # Token logprobs come with at least one alternative from llama-server; the output
        # lists as many as were asked for.
        n_probs=max(top, 1) if top is not None else 0,
        json_schema=format_.schema_or_none() if format_ else None,
    )
    return BatchRequestLine(
        custom_id=line.custom_id,
        line=number,
        system=system,
        messages=messages,
        params=params,
        top_logprobs=top,
    )


def _param(error: ValidationError) -> str | None:
    first = error.errors()[0]["loc"] if error.error_count() else ()
    return ".".join(str(part) for part in first) or None


def parse_batch_input(lines: Iterable[bytes], *, endpoint: str) -> BatchInput:
    """Validate every line of a batch input file (OpenAI's rules; blank lines are skipped)."""
    valid: list[BatchRequestLine] = []
    errors: list[BatchLineError] = []
    count = 0
    first_line: dict[str, int] = {}

    def fail(code: str, message: str, number: int, param: str | None = None) -> None:
        nonlocal count
        count += 1
        if len(errors) < MAX_LISTED_ERRORS:
            errors.append(BatchLineError(code=code, message=message, param=param, line=number))

    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            fail("invalid_json_line", f"line {number} is not valid JSON: {error}", number)
            continue
        if not isinstance(record, dict):
            fail("invalid_json_line", f"line {number} is not a JSON object", number)
            continue
        if record.get("url") != endpoint:
            fail(
                "invalid_url",
                f"line {number}: url {record.get('url')!r} does not match the batch's endpoint "
                f"{endpoint!r}",
                number,
                "url",
            )
            continue
        try:
            request = _request_line(_Line.model_validate(record), number)
        except ValidationError as error:
            reason = format_validation_error(error)
            fail("invalid_request", f"line {number}: {reason}", number, _param(error))
            continue
        except ValueError as error:
            fail("invalid_request", f"line {number}: {error}", number, "body.messages")
            continue
        if request.custom_id in first_line:
            fail(
                "duplicate_custom_id",
                f"line {number}: custom_id {request.custom_id!r} is already used on line "
                f"{first_line[request.custom_id]}",
                number,
                "custom_id",
            )
            continue
        first_line[request.custom_id] = number
        valid.append(request)
    if not valid and not count:
        fail("empty_file", "the input file holds no requests", 1)
    return BatchInput(lines=valid if not count else [], errors=errors, error_count=count)


# ---- output ---------------------------------------------------------------------------------


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


def response_line(answer: AnsweredRequest, *, top_logprobs: int | None = None) -> str:
    """The output-file line of a finished request: a chat completion as OpenAI returns it.

    `top_logprobs`: how many alternatives the request asked for (None: all that were kept).
    An answer cut off at max_tokens is a success with `finish_reason: "length"`.
    """
    message: dict[str, Any] = {"role": "assistant", "content": answer.content, "refusal": None}
    if answer.reasoning:
        message["reasoning_content"] = answer.reasoning
    choice: dict[str, Any] = {
        "index": 0,
        "message": message,
        "logprobs": _logprobs(answer.logprobs, top_logprobs) if answer.logprobs else None,
        "finish_reason": answer.finish_reason,
    }
    body = {
        "id": f"chatcmpl-{answer.request_id}",
        "object": "chat.completion",
        "created": _epoch(answer.created_at),
        "model": answer.model,
        "choices": [choice],
        "usage": {
            "prompt_tokens": answer.prompt_tokens,
            "completion_tokens": answer.completion_tokens,
            "total_tokens": answer.prompt_tokens + answer.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": answer.cached_tokens},
        },
    }
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
