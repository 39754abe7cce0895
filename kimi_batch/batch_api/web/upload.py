"""`POST /v1/files` read as it streams: the file part to a temp file, counted, cut at the limit.

The multipart body is parsed with python-multipart's streaming parser straight from the request
stream (no form spooled anywhere first), so a chunked upload without `Content-Length` meets the
same limit as a declared one: the byte past `max_bytes` is never written, the partial file is
removed and the answer is 413. The temp file lies in the store's own folder (0600), from where
the store copies it in. Other form fields are small words (`purpose`): a few, each bounded.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import IO

from fastapi import Request
from pydantic import BaseModel, ConfigDict
from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header

from kimi_batch.batch_api.web.bodies import declared_length
from kimi_batch.batch_api.web.errors import ApiError
from kimi_batch.paths import PRIVATE_FILE_MODE

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
        name = options.get(b"name", b"").decode("latin-1")
        if name != "file":
            self._into = self.fields.setdefault(name, bytearray())
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
