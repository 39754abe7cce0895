"""What a request must pass before a route acts on it, and how the API refuses one.

Every refusal is an `ApiError`, answered in OpenAI's error shape (`{"error": {"message", "type",
"param", "code"}}` with its status code; `install_error_handlers` makes FastAPI's own errors
take it too).

**Who reaches the API.** `Guard` is ASGI middleware in front of every route (`/openapi.json` and
unknown paths included), checking the request's headers before any route runs or any body byte
is read, in this order:

1. `Host` names the server (loopback names, the bind host, `KIMI_BATCH_API_ALLOWED_HOSTS`),
   any port: else 421. A web page that rebinds its DNS name to 127.0.0.1 sends its own name.
2. No CORS: an `OPTIONS` preflight, an `Origin` other than the server's own, or a browser's
   `Sec-Fetch-Site: cross-site` is 403. Browsers send `Origin` on every cross-origin POST,
   including the "simple" `text/plain` ones that need no preflight.
3. `Authorization: Bearer <key>`, compared in constant time: else 401. No key only with
   `--no-auth` (`ApiAccess.key` None).

**JSON bodies** (`json_body`, `no_body`) are read only as `application/json` and only up to
`JSON_BODY_LIMIT` bytes, counted as the body arrives, so a chunked body (no `Content-Length`) is
refused at the limit as a declared one is, before it is parsed. Requiring the JSON media type is
part of refusing browsers: a cross-origin page can POST `text/plain` without a preflight, never
`application/json`.

**An upload** (`POST /v1/files`, `receive_upload`) is read as it streams: the multipart body is
parsed with python-multipart's streaming parser straight from the request stream (no form
spooled anywhere first), so a chunked upload without `Content-Length` meets the same limit as a
declared one: the byte past `max_bytes` is never written, the partial file is removed and the
answer is 413. The temp file lies in the store's own folder (0600), from where the store copies
it in. A client gone before its body ended is answered 400 `client_disconnected` (to no one: it
is not logged as a crash), its partial file removed. Other form fields are small words
(`purpose`): a few, each named once and bounded.
"""

from __future__ import annotations

import hmac
import json
import os
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import IO, Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from kimi_batch.paths import PRIVATE_FILE_MODE


class ApiError(Exception):
    """An expected failure of a request, answered in OpenAI's error shape."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code


def error_response(error: ApiError) -> JSONResponse:
    body = {
        "error": {
            "message": error.message,
            "type": error.type,
            "param": error.param,
            "code": error.code,
        }
    }
    return JSONResponse(body, status_code=error.status)


def invalid_request(errors: Sequence[Any]) -> ApiError:
    """A 400 naming the first of pydantic's (or FastAPI's) validation errors."""
    first = errors[0] if errors else {}
    location = [str(part) for part in first.get("loc", ()) if part not in ("body", "query")]
    param = ".".join(location) or None
    detail = str(first.get("msg", "invalid request")).removeprefix("Value error, ")
    return ApiError(400, f"{param}: {detail}" if param else detail, param=param)


async def _api_error(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, ApiError)
    return error_response(error)


async def _http_error(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, StarletteHTTPException)
    code = "not_found" if error.status_code == 404 else None
    return error_response(ApiError(error.status_code, str(error.detail), code=code))


async def _validation_error(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, RequestValidationError)
    return error_response(invalid_request(error.errors()))


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)


LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
# Addresses one binds to, never one a client names.
_WILDCARDS = frozenset({"", "0.0.0.0", "::"})


class ApiAccess(BaseModel):
    """What the guard lets through: the key (None: `--no-auth`) and the Host names."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str | None = Field(
        repr=False, min_length=1, description="The bearer key; None only with --no-auth."
    )
    bound_host: str = Field(description="The address the server binds (a Host it answers).")
    allowed_hosts: tuple[str, ...] = Field(
        default=(), description="More Host names (KIMI_BATCH_API_ALLOWED_HOSTS)."
    )
    key_file: Path | None = Field(default=None, description="Where a generated key is kept.")

    @property
    def host_names(self) -> frozenset[str]:
        named = {host_name(host) for host in (self.bound_host, *self.allowed_hosts)}
        return LOOPBACK_NAMES | {name for name in named if name and name not in _WILDCARDS}


def host_name(value: str) -> str | None:
    """The name of a Host header without its port: `[::1]:8090` -> `::1`; None if malformed."""
    # HTTP's whitespace around a value is SP and HTAB; str.strip also takes U+00A0, U+0085 and
    # the like, and str.isdigit '²': a Host padded or "ported" with them named the server.
    value = value.strip(" \t").lower()
    if value.startswith("["):
        end = value.find("]")
        port = value[end + 1 :] if end > 0 else ":x"
        if port and not (port.startswith(":") and _is_port(port[1:])):
            return None
        return value[1:end]
    if value.count(":") > 1:  # a bare IPv6 address, as some clients send it
        return value
    name, _, port = value.partition(":")
    if port and not _is_port(port):
        return None
    return name.rstrip(".") or None


def _is_port(text: str) -> bool:
    return text.isascii() and text.isdigit()


class Guard:
    """ASGI middleware: refuses a request on its headers alone (see the module docstring)."""

    def __init__(self, app: ASGIApp, access: ApiAccess) -> None:
        self.app = app
        self.names = access.host_names
        self.expected = access.key.encode() if access.key is not None else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":  # no route speaks it; refuse before any handshake
            await send({"type": "websocket.close", "code": 1008})
            return
        if scope["type"] == "http":
            refusal = self.refusal(Headers(scope=scope), scope["method"])
            if refusal is not None:
                await error_response(refusal)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def refusal(self, headers: Headers, method: str) -> ApiError | None:
        host = headers.get("host", "")
        if host_name(host) not in self.names:
            return ApiError(
                421,
                f"this server does not answer for Host {host[:100]!r} "
                "(add it to KIMI_BATCH_API_ALLOWED_HOSTS)",
                code="unknown_host",
            )
        origin = headers.get("origin")
        own = (f"http://{host}", f"https://{host}")
        cross_site = headers.get("sec-fetch-site") in ("cross-site", "same-site")
        if method == "OPTIONS" or (origin is not None and origin not in own) or cross_site:
            return ApiError(
                403, "cross-origin requests are refused (no CORS)", code="cross_origin_refused"
            )
        if self.expected is not None:
            scheme, _, token = headers.get("authorization", "").partition(" ")
            # The scheme is case-insensitive (RFC 9110); the key is compared in constant time.
            # Only HTTP's own whitespace (SP, HTAB) around it: str.strip takes U+00A0 too.
            given = token.strip(" \t").encode() if scheme.lower() == "bearer" else b""
            if not hmac.compare_digest(given, self.expected):
                return ApiError(401, "Incorrect API key provided.", code="invalid_api_key")
        return None


JSON_BODY_LIMIT = 1 << 20
_JSON = "application/json"
M = TypeVar("M", bound=BaseModel)


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"the request body is over the limit of {limit} bytes")


def _client_gone() -> ApiError:
    # Starlette raises ClientDisconnect out of the body's stream; left to escape the app, every
    # interrupted upload is logged by uvicorn as a crash ("Exception in ASGI application").
    return ApiError(400, "the client went away before its body ended", code="client_disconnected")


def declared_length(request: Request) -> int | None:
    """The `Content-Length` the client declared, if any (a malformed one is a 400)."""
    value = request.headers.get("content-length")
    if value is None:
        return None
    digits = value.strip(" \t")  # HTTP's whitespace, not U+00A0 or U+0085 (str.strip)
    # ASCII digits only: str.isdigit also takes '²' (a header's Latin-1 can carry it), which
    # int() refuses; and at most 19 (no body is that long), as int() refuses past 4,300 digits.
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 19:
        raise ApiError(400, f"Content-Length {value[:40]!r} is not a number")
    return int(digits)


def _media_type(request: Request) -> str | None:
    value = request.headers.get("content-type")
    return value.split(";", 1)[0].strip().lower() if value is not None else None


async def _read(request: Request, limit: int) -> bytes:
    declared = declared_length(request)
    if declared is not None and declared > limit:
        raise _too_large(limit)
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise _too_large(limit)
    except ClientDisconnect:
        raise _client_gone() from None
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


# Multipart framing around the file: part headers and boundaries, a few hundred bytes in practice.
_SLACK = 64 * 1024
_MAX_PARTS = 8
_MAX_FIELD = 1024


class ReceivedUpload(BaseModel):
    """A form received whole: the file's temp path (the caller removes it) and the fields."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: Path
    filename: str
    purpose: str | None
    size: int


class _Form:
    """python-multipart's callbacks: the `file` part to `temp`, other fields in memory."""

    def __init__(self, temp: Path, max_bytes: int) -> None:
        self.temp, self.max_bytes = temp, max_bytes
        self.fields: dict[str, bytearray] = {}
        self.filename: str | None = None
        self.size = self.parts = 0
        self.ended = False
        self.writer: IO[bytes] | None = None
        self._into: bytearray | IO[bytes] | None = None
        self._header = (bytearray(), bytearray())
        self._disposition = b""

    def on_part_begin(self) -> None:
        self.parts += 1
        if self.parts > _MAX_PARTS:
            raise ApiError(400, f"a file upload has at most {_MAX_PARTS} form fields")
        self._disposition, self._into = b"", None

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._header[0].extend(data[start:end])

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._header[1].extend(data[start:end])

    def on_header_end(self) -> None:
        field, value = self._header
        if field.strip().lower() == b"content-disposition":
            self._disposition = bytes(value)
        field.clear()
        value.clear()

    def on_headers_finished(self) -> None:
        _, options = parse_options_header(self._disposition)
        named = options.get(b"name")
        if named is None:  # RFC 7578 requires a name; Starlette's own parser refuses it too
            raise ApiError(400, "a form part has no name (Content-Disposition: form-data; name=)")
        name = named.decode("latin-1")
        if name != "file":
            # Each field once: two values were joined (`ba` + `tch` read as purpose `batch`).
            if name in self.fields:
                raise ApiError(
                    400, f"the form field {name[:40]!r} is given twice", param=name[:100]
                )
            self._into = self.fields[name] = bytearray()
            return
        if self.writer is not None:
            raise ApiError(400, "one file per upload", param="file")
        filename = options.get(b"filename", b"").decode("utf-8", "replace")
        self.filename = filename or "upload.jsonl"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        self.writer = self._into = os.fdopen(os.open(self.temp, flags, PRIVATE_FILE_MODE), "wb")

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        if isinstance(self._into, bytearray):
            if len(self._into) + end - start > _MAX_FIELD:
                raise ApiError(400, f"a form field is over {_MAX_FIELD} bytes")
            self._into.extend(data[start:end])
        elif self._into is not None:
            self.size += end - start
            if self.size > self.max_bytes:  # checked before the write: never a byte past it
                raise file_too_large(self.max_bytes)
            self._into.write(data[start:end])

    def on_part_end(self) -> None:
        self._into = None

    def on_end(self) -> None:
        self.ended = True

    def field(self, name: str) -> str | None:
        value = self.fields.get(name)
        return value.decode("utf-8", "replace") if value is not None else None


def file_too_large(max_bytes: int) -> ApiError:
    return ApiError(
        413,
        f"the file is over the limit of {max_bytes} bytes "
        "(KIMI_BATCH_API_MAX_BATCH_MB, at most KIMI_BATCH_MAX_INPUT_MB)",
        param="file",
        code="file_too_large",
    )


def _boundary(request: Request) -> bytes:
    media, options = parse_options_header(request.headers.get("content-type", ""))
    if media != b"multipart/form-data":
        raise ApiError(415, "an upload is multipart/form-data", code="unsupported_media_type")
    boundary = options.get(b"boundary")
    if not boundary:
        raise ApiError(400, "the multipart form has no boundary")
    return boundary


async def receive_upload(request: Request, folder: Path, max_bytes: int) -> ReceivedUpload:
    """The form of `request`, its file written under `folder`; 413 past `max_bytes`."""
    boundary = _boundary(request)
    declared = declared_length(request)
    if declared is not None and declared > max_bytes + _SLACK:
        raise file_too_large(max_bytes)
    form = _Form(folder / f".upload-{uuid.uuid4().hex}.tmp", max_bytes)
    callbacks = {name: getattr(form, name) for name in dir(form) if name.startswith("on_")}
    received = 0
    try:
        parser = MultipartParser(boundary, callbacks)  # type: ignore[arg-type]
        async for chunk in request.stream():
            received += len(chunk)
            if received > max_bytes + _SLACK:
                raise file_too_large(max_bytes)
            parser.write(chunk)
        parser.finalize()
    except FormParserError as error:
        form.temp.unlink(missing_ok=True)
        raise ApiError(400, f"the multipart form is malformed ({error})") from None
    except ClientDisconnect:
        form.temp.unlink(missing_ok=True)
        raise _client_gone() from None
    except BaseException:
        form.temp.unlink(missing_ok=True)
        raise
    finally:
        if form.writer is not None:
            form.writer.close()
    if not form.ended:  # the parser does not check that the closing boundary came
        form.temp.unlink(missing_ok=True)
        raise ApiError(400, "the multipart form ends before its closing boundary")
    if form.filename is None:
        raise ApiError(400, "a file is required", param="file")
    return ReceivedUpload(
        path=form.temp, filename=form.filename, purpose=form.field("purpose"), size=form.size
    )
