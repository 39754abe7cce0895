"""The OpenAI-compatible Batch API: `/v1/files` and `/v1/batches` over the pipeline.

An upload is kept in the API's file store (content-addressed, 0600, at most the input limit:
larger ones get 413 before a byte is kept). Creating a batch validates its input file (the whole
batch fails, with errors naming the lines, on a bad one) and lands it as the input of a partition
of its own; the API batch sensor starts its Dagster run. Its `request_counts` are read from the
ledger on every retrieve. Cancel marks it `cancelling`: the run stops the requests in flight,
writes the partial output and error files and marks it `cancelled`.

Every `/v1` route needs `Authorization: Bearer $KIMI_BATCH_API_KEY` when a key is set, checked
before the request body is read.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Iterator
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Query, Request, Response
from fastapi.responses import FileResponse, JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.api.errors import ApiError, error_response, install_error_handlers
from kimi_batch.engine import Ledger
from kimi_batch.settings import Settings
from kimi_batch.storage import (
    ApiStore,
    BatchRecord,
    BatchStatus,
    FileRecord,
    FileTooLargeError,
    request_counts,
    validate_batch,
)
from kimi_batch.tasks.openai_batch import CHAT_COMPLETIONS_URL

__all__ = ["COMPLETION_WINDOWS", "create_app"]

COMPLETION_WINDOWS = {"24h": 24 * 3600}
# Multipart framing around an upload: headers and boundaries, a few hundred bytes in practice.
_MULTIPART_SLACK = 64 * 1024
_BATCH_FIELDS = (
    "id",
    "endpoint",
    "input_file_id",
    "completion_window",
    "status",
    "output_file_id",
    "error_file_id",
    "created_at",
    "in_progress_at",
    "expires_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelling_at",
    "cancelled_at",
    "metadata",
)


class BatchCreate(BaseModel):
    """The body of `POST /v1/batches`."""

    model_config = ConfigDict(extra="ignore")

    input_file_id: str = Field(min_length=1)
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = None


def _store(request: Request) -> Iterator[ApiStore]:
    """The deployment's store, opened for one request (SQLite connections are per thread)."""
    settings: Settings = request.app.state.settings
    with ApiStore(settings.paths) as opened:
        yield opened


StoreDep = Annotated[ApiStore, Depends(_store)]


def _page(items: list[dict[str, Any]], limit: int, more: bool) -> dict[str, Any]:
    return {
        "object": "list",
        "data": items,
        "first_id": items[0]["id"] if items else None,
        "last_id": items[-1]["id"] if items else None,
        "has_more": more,
    }


def create_app(settings: Settings) -> FastAPI:
    """The app for one deployment (its state dir, input limit and key)."""
    app = FastAPI(title="kimi_batch Batch API", docs_url=None, redoc_url=None)
    install_error_handlers(app)
    app.state.settings = settings
    max_bytes = settings.max_input_bytes

    @app.middleware("http")
    async def guard(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        # Before the body is read: a wrong key or an oversized upload never reaches the store.
        if request.url.path.startswith("/v1/") and settings.api_key:
            given = request.headers.get("authorization", "")
            expected = f"Bearer {settings.api_key}"
            if not hmac.compare_digest(given.encode(), expected.encode()):
                return error_response(
                    ApiError(401, "Incorrect API key provided.", code="invalid_api_key")
                )
        if request.method == "POST" and request.url.path == "/v1/files":
            length = request.headers.get("content-length")
            if (
                length is not None
                and length.isdigit()
                and int(length) > max_bytes + _MULTIPART_SLACK
            ):
                return _too_large(max_bytes)
        return await call_next(request)

    def batch_object(opened: ApiStore, batch: BatchRecord) -> dict[str, Any]:
        body: dict[str, Any] = {"object": "batch", **batch.model_dump(include=set(_BATCH_FIELDS))}
        body["status"] = batch.status.value
        body["errors"] = (
            {"object": "list", "data": [e.model_dump() for e in batch.errors]}
            if batch.errors
            else None
        )
        with Ledger(settings.paths.ledger_path) as ledger:
            body["request_counts"] = request_counts(opened, ledger, batch).model_dump()
        return body

    def file_object(record: FileRecord) -> dict[str, Any]:
        return record.model_dump()

    def found_file(opened: ApiStore, file_id: str) -> FileRecord:
        record = opened.file(file_id)
        if record is None:
            raise ApiError(404, f"No such File object: {file_id}", param="id", code="not_found")
        return record

    def found_batch(opened: ApiStore, batch_id: str) -> BatchRecord:
        batch = opened.batch(batch_id)
        if batch is None:
            raise ApiError(404, f"No such Batch object: {batch_id}", param="id", code="not_found")
        return batch

    @app.post("/v1/files")
    async def upload_file(request: Request, opened: StoreDep) -> JSONResponse:
        """Upload a batch input file (multipart `purpose=batch`, `file`); too large: 413."""
        form = await request.form()
        purpose, upload = form.get("purpose"), form.get("file")
        if purpose != "batch":
            raise ApiError(400, "purpose must be 'batch'", param="purpose")
        if upload is None or isinstance(upload, str):
            raise ApiError(400, "a file is required", param="file")
        try:
            record = opened.add_file(
                upload.file,
                filename=upload.filename or "upload.jsonl",
                purpose="batch",
                max_bytes=max_bytes,
            )
        except FileTooLargeError:
            return _too_large(max_bytes)
        finally:
            await upload.close()
        return JSONResponse(file_object(record))

    @app.get("/v1/files")
    def list_files(
        opened: StoreDep,
        purpose: str | None = None,
        after: str | None = None,
        limit: Annotated[int, Query(ge=1, le=10000)] = 10000,
    ) -> dict[str, Any]:
        """List the uploaded and generated files, newest first."""
        records = opened.files(purpose=purpose, after=after, limit=limit + 1)
        items = [file_object(r) for r in records[:limit]]
        return _page(items, limit, len(records) > limit)

    @app.get("/v1/files/{file_id}")
    def get_file(file_id: str, opened: StoreDep) -> dict[str, Any]:
        """A file object: its id, size, name and purpose."""
        return file_object(found_file(opened, file_id))

    @app.get("/v1/files/{file_id}/content")
    def file_content(file_id: str, opened: StoreDep) -> FileResponse:
        """The file's bytes: an input, or a batch's output or error lines."""
        record = found_file(opened, file_id)
        return FileResponse(opened.blob_path(record), media_type="application/octet-stream")

    @app.delete("/v1/files/{file_id}")
    def delete_file(file_id: str, opened: StoreDep) -> dict[str, Any]:
        """Delete a file."""
        found_file(opened, file_id)
        opened.delete_file(file_id)
        return {"id": file_id, "object": "file", "deleted": True}

    @app.post("/v1/batches")
    def create_batch(body: BatchCreate, opened: StoreDep) -> dict[str, Any]:
        """Create a batch: the input file is validated whole and landed; its run starts at once."""
        if body.endpoint != CHAT_COMPLETIONS_URL:
            raise ApiError(400, f"endpoint must be {CHAT_COMPLETIONS_URL!r} here", param="endpoint")
        window = COMPLETION_WINDOWS.get(body.completion_window)
        if window is None:
            raise ApiError(400, "completion_window must be '24h'", param="completion_window")
        upload = opened.file(body.input_file_id)
        if upload is None or upload.purpose != "batch":
            raise ApiError(400, f"no batch input file {body.input_file_id}", param="input_file_id")
        batch = opened.add_batch(
            input_file_id=upload.id,
            endpoint=body.endpoint,
            completion_window=body.completion_window,
            completion_window_s=window,
            metadata=body.metadata,
        )
        return batch_object(opened, validate_batch(settings, opened, batch))

    @app.get("/v1/batches")
    def list_batches(
        opened: StoreDep,
        after: str | None = None,
        limit: Annotated[int, Query(ge=1, le=100)] = 20,
    ) -> dict[str, Any]:
        """List the batches, newest first."""
        records = opened.batches(after=after, limit=limit + 1)
        items = [batch_object(opened, r) for r in records[:limit]]
        return _page(items, limit, len(records) > limit)

    @app.get("/v1/batches/{batch_id}")
    def get_batch(batch_id: str, opened: StoreDep) -> dict[str, Any]:
        """A batch: its status, request counts (from the ledger) and output and error files."""
        return batch_object(opened, found_batch(opened, batch_id))

    @app.post("/v1/batches/{batch_id}/cancel")
    def cancel_batch(batch_id: str, opened: StoreDep) -> dict[str, Any]:
        """Cancel a batch: its requests in flight stop, the partial files are written."""
        batch = found_batch(opened, batch_id)
        if batch.terminal:
            raise ApiError(409, f"batch {batch_id} is {batch.status.value}: it cannot be cancelled")
        if batch.status != BatchStatus.CANCELLING:
            batch = opened.update_batch(batch_id, status=BatchStatus.CANCELLING)
        return batch_object(opened, batch)

    return app


def _too_large(max_bytes: int) -> JSONResponse:
    return error_response(
        ApiError(
            413,
            f"file is over the input limit of {max_bytes} bytes (KIMI_BATCH_MAX_INPUT_MB)",
            param="file",
            code="file_too_large",
        )
    )
