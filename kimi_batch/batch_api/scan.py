"""A Batch API input file validated as it streams by: OpenAI's rules, each failure a line error.

One JSON object a line, `{custom_id, method, url, body}`, `body` a chat completion request or,
in a `/v1/completions` batch, a completion request (`request_bodies`: the fields each may
hold become the request's params, unset ones take OpenAI's defaults). Any other field, or a
`model` not served, fails its line (`request_fields`): a batch runs the request it was
given. Validation is all or nothing, as OpenAI's: one bad line fails the batch with errors
naming it (the first `MAX_LISTED_ERRORS` listed, all counted).

The file is read line by line with the pipeline's own JSONL reader (`inputs.formats.jsonl_items`:
bounded lines, bad UTF-8, deep nesting and over-long integers become line errors there), and
nothing but the `custom_id` index (8-byte digests, `SeenIds`) outlives a line: `scan_batch_input`
holds one line at a time whatever the file's size. Whatever a line makes the parser or the
models raise is that line's error, never an exception out of here. At most `max_requests`
requests (OpenAI's 50,000); the line past it fails the batch and ends the read.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator, Sequence
from typing import IO, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kimi_batch.batch_api.lines import (
    BATCH_ENDPOINTS,
    MAX_LISTED_ERRORS,
    BatchInput,
    BatchLineError,
    BatchRequestLine,
    LineKind,
)
from kimi_batch.batch_api.request_bodies import LineRefusedError, request_line
from kimi_batch.batch_api.request_fields import model_not_served, refused_field
from kimi_batch.inputs import MAX_ROW_BYTES, Item, SeenIds, format_validation_error, jsonl_items
from kimi_batch.settings import DEFAULT_API_MAX_BATCH_REQUESTS

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


def iter_batch_input(
    file: IO[bytes], *, endpoint: str, max_requests: int = MAX_BATCH_REQUESTS
) -> Iterator[BatchRequestLine]:
    """The requests of a landed (validated) input one at a time, none kept: a read that must
    not hold the whole batch (its output files). ValueError at the first line that no longer
    validates."""
    validator = BatchValidator(endpoint=endpoint, max_requests=max_requests)
    for request in _valid_lines(
        validator, jsonl_items(file, max_row_bytes=MAX_BATCH_LINE_BYTES), None
    ):
        if validator.error_count:
            break
        yield request
    scan = validator.finish()
    if scan.error_count:
        raise ValueError(f"{scan.error_count} lines no longer validate: {scan.errors[0].message}")
