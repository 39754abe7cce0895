"""JSON request bodies, read only as `application/json` and only up to `JSON_BODY_LIMIT` bytes.

Counted as the body arrives, so a chunked body (no `Content-Length`) is refused at the limit as
a declared one is, before it is parsed. Requiring the JSON media type is part of refusing
browsers: a cross-origin page can POST `text/plain` without a preflight, never
`application/json`.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from kimi_batch.batch_api.web.errors import ApiError, invalid_request

JSON_BODY_LIMIT = 1 << 20
_JSON = "application/json"
M = TypeVar("M", bound=BaseModel)


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"the request body is over the limit of {limit} bytes")


def declared_length(request: Request) -> int | None:
    """The `Content-Length` the client declared, if any (a malformed one is a 400)."""
    value = request.headers.get("content-length")
    if value is None:
        return None
    if not value.strip().isdigit():
        raise ApiError(400, f"Content-Length {value[:40]!r} is not a number")
    return int(value)


def _media_type(request: Request) -> str | None:
    value = request.headers.get("content-type")
    return value.split(";", 1)[0].strip().lower() if value is not None else None


async def _read(request: Request, limit: int) -> bytes:
    declared = declared_length(request)
    if declared is not None and declared > limit:
        raise _too_large(limit)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise _too_large(limit)
    return bytes(body)


def json_body(model: type[M]) -> Callable[[Request], Awaitable[M]]:
    """A dependency: the body as `model`, or 415 (not JSON), 413 (too long), 400 (invalid)."""

    async def read(request: Request) -> M:
        if _media_type(request) != _JSON:
            raise ApiError(415, f"the body must be {_JSON}", code="unsupported_media_type")
        data = await _read(request, JSON_BODY_LIMIT)
        try:
            return model.model_validate_json(data)
        except ValidationError as error:
            raise invalid_request(error.errors(include_context=False)) from None

    return read


async def no_body(request: Request) -> None:
    """A dependency of routes that take no body: none at all, or JSON (ignored)."""
    media = _media_type(request)
    if media not in (None, _JSON):
        raise ApiError(415, f"send no body, or {_JSON}", code="unsupported_media_type")
    data = await _read(request, JSON_BODY_LIMIT)
    if media is None and data.strip():
        raise ApiError(415, f"a body needs Content-Type {_JSON}", code="unsupported_media_type")
    if data.strip():
        try:
            json.loads(data)
        except (ValueError, RecursionError):
            raise ApiError(400, "the body is not valid JSON") from None
