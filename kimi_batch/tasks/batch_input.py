"""A Batch API input file validated as it streams by: OpenAI's rules, each failure a line error.

One JSON object a line, `{custom_id, method, url, body}`, `body` a chat completion request:
`max_tokens` (or `max_completion_tokens`), `temperature`, `top_p`, `seed`, `stop`, the
penalties, `logit_bias`, `response_format` (JSON schema or object) and
`logprobs`/`top_logprobs` become the request's sampling params; unset values take OpenAI's
defaults (temperature 1, top_p 1). Any other field, or a `model` not served, fails its line
(`tasks.batch_fields`): a batch runs the request it was given. Validation is all or nothing, as
OpenAI's: one bad line fails the batch with errors naming it (the first `MAX_LISTED_ERRORS`
listed, all counted).

The file is read line by line with the pipeline's own JSONL reader (`input_formats.jsonl_items`:
bounded lines, bad UTF-8, deep nesting and over-long integers become line errors there), and
nothing but the `custom_id` index (8-byte digests, `SeenIds`) outlives a line: `scan_batch_input`
holds one line at a time whatever the file's size. Whatever a line makes the parser or the
models raise is that line's error, never an exception out of here. At most `max_requests`
requests (OpenAI's 50,000); the line past it fails the batch and ends the read.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator, Sequence
from typing import IO, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from kimi_batch.engine import SamplingParams
from kimi_batch.llama import ChatMessage
from kimi_batch.settings import DEFAULT_API_MAX_BATCH_REQUESTS
from kimi_batch.tasks.batch_fields import (
    check_logit_bias,
    check_stops,
    model_not_served,
    refused_field,
)
from kimi_batch.tasks.input_formats import MAX_ROW_BYTES, Item, jsonl_items
from kimi_batch.tasks.openai_batch import (
    MAX_LISTED_ERRORS,
    BatchInput,
    BatchLineError,
    BatchRequestLine,
)
from kimi_batch.tasks.raw_rows import format_validation_error
from kimi_batch.tasks.seen_ids import SeenIds

__all__ = [
    "MAX_BATCH_LINE_BYTES",
    "MAX_BATCH_REQUESTS",
    "MAX_NESTING",
    "BatchScan",
    "BatchValidator",
    "parse_batch_input",
    "scan_batch_input",
]

# OpenAI's limit per batch; the default of `max_requests`. The API's validation passes
# `settings.api_max_batch_requests` (KIMI_BATCH_API_MAX_BATCH_REQUESTS).
MAX_BATCH_REQUESTS = DEFAULT_API_MAX_BATCH_REQUESTS
# The pipeline's row bound (~250k tokens, more than a slot's context on the target).
MAX_BATCH_LINE_BYTES = MAX_ROW_BYTES
# Deeper than any chat request or JSON schema needs; a deeper value could overflow the
# serializers that hash and send the request later, in the run.
MAX_NESTING = 64
# OpenAI's chat completion defaults; max_tokens unset means "as long as the server allows"
# (the engine clamps it to the server's n_predict).
_DEFAULT_MAX_TOKENS = 1 << 20
_DEFAULT_TEMPERATURE = 1.0
_DEFAULT_TOP_P = 1.0


class BatchScan(BaseModel):
    """What validating a batch input found: its request count, or why it does not validate."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    request_total: int = Field(ge=0)
    errors: list[BatchLineError]
    error_count: int = Field(ge=0, description="All errors; `errors` lists the first ones.")


# ---- the boundary: what a client may send ------------------------------------------------


class _RefusedError(ValueError):
    """A line that validates as models but asks for what is not served; names its field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


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
            raise _RefusedError(
                "response_format.json_schema.schema must be a JSON schema object",
                "body.response_format",
            )
        return schema


class _Body(BaseModel):
    # Unknown fields are refused before this model is built (`refused_field`).
    model_config = ConfigDict(extra="ignore", frozen=True)

    model: str | None = None
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
    stop: str | list[str] | None = None
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None

    _stops = field_validator("stop")(check_stops)
    _biases = field_validator("logit_bias")(check_logit_bias)


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
        raise _RefusedError(
            "a system message is only supported before the conversation", "body.messages"
        )
    if not rest or rest[-1].role != "user":
        raise _RefusedError("the last message must be from the user", "body.messages")
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
        stop=[body.stop] if isinstance(body.stop, str) else body.stop or None,
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        logit_bias=body.logit_bias,
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


def _too_deep(value: Any, limit: int) -> bool:
    """Whether `value` nests containers deeper than `limit` (iteratively: no recursion)."""
    stack: list[tuple[dict[str, Any] | list[Any], int]] = (
        [(value, 1)] if isinstance(value, (dict, list)) else []
    )
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


# ---- the streaming validator -------------------------------------------------------------


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
        self.endpoint = endpoint
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
        if _too_deep(record, MAX_NESTING):
            message = f"line {number}: nested deeper than {MAX_NESTING} levels"
            self._fail("invalid_json_line", message, number)
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
        refused = refused_field(record.get("body"))
        if refused is not None:
            param, why = refused
            self._fail("unsupported_field", f"line {number}: {param} {why}", number, param)
            return None
        model = model_not_served(record.get("body"), self.models)
        if model is not None:
            self._fail("model_not_found", f"line {number}: {model}", number, "body.model")
            return None
        try:
            request = _request_line(_Line.model_validate(record), number)
            # What the run hashes and sends must serialize (a lone surrogate would not).
            request.model_dump_json()
        except ValidationError as error:
            reason = format_validation_error(error)
            self._fail("invalid_request", f"line {number}: {reason}", number, _param(error))
            return None
        except _RefusedError as error:
            self._fail("invalid_request", f"line {number}: {error}", number, error.param)
            return None
        except (ValueError, TypeError, RecursionError, OverflowError) as error:
            # Nothing a line holds may escape as an exception: it is this line's error.
            reason = f"{type(error).__name__}: {str(error)[:200]}"
            self._fail("invalid_request", f"line {number}: {reason}", number)
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
    for _ in _valid_lines(
        validator, jsonl_items(file, max_row_bytes=MAX_BATCH_LINE_BYTES), on_line
    ):
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
