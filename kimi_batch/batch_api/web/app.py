"""The OpenAI-compatible Batch API: `/v1/files` and `/v1/batches` over the pipeline.

`create_app` wires the two routers behind the `Guard` (Host allow-list, no CORS, the bearer key:
`guard.py`), which covers every path, `/openapi.json` included. There is no `/docs` page: it
would load its scripts from a CDN and could not send the key. Every route gets the deployment's
settings and its store, opened for one request (`StoreDep`); a list is OpenAI's list object
around one page (`page`).

`/v1/files`: upload (streamed, bounded: `guard.receive_upload`), list, retrieve, content,
delete.

`/v1/batches`: create, list, retrieve, cancel. Creating a batch records it `validating` and
returns; the app's `BatchValidator` (worker threads) validates its input file as it streams
(the whole batch fails, with errors naming the lines, on a bad one) and lands it as the input of
a partition of its own, and resumes at start what a killed API process left `validating`; the
API batch sensor starts its Dagster run. Its `request_counts` are read from the ledger on every
retrieve. Cancel marks it `cancelling`: the run stops the requests in flight, writes the partial
output and error files and marks it `cancelled`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Annotated, Any, BinaryIO

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from kimi_batch.batch_api import (
    BATCH_ENDPOINTS,
    ApiStore,
    BatchRecord,
    BatchStatus,
    BatchValidator,
    FileContentMissingError,
    FileRecord,
    request_counts,
)
from kimi_batch.batch_api.web.guard import (
    ApiAccess,
    ApiError,
    Guard,
    ReceivedUpload,
    install_error_handlers,
    json_body,
    no_body,
    receive_upload,
)
from kimi_batch.engine import Ledger
from kimi_batch.settings import Settings


def _settings_of(request: Request) -> Settings:
    """The `Settings` the app was built with."""
    settings: Settings = request.app.state.settings
    return settings


def _store(request: Request) -> Iterator[ApiStore]:
    """The deployment's store, opened for one request (SQLite connections are per thread)."""
    with ApiStore(_settings_of(request).paths) as opened:
        yield opened


StoreDep = Annotated[ApiStore, Depends(_store)]


def _page(items: list[dict[str, Any]], more: bool) -> dict[str, Any]:
    """OpenAI's list object around one page of items."""
    return {
        "object": "list",
        "data": items,
        "first_id": items[0]["id"] if items else None,
        "last_id": items[-1]["id"] if items else None,
        "has_more": more,
    }


# ---- /v1/files -------------------------------------------------------------------------------

files_router = APIRouter(prefix="/v1/files")
_CONTENT_CHUNK = 1 << 20


def _file_found(opened: ApiStore, file_id: str) -> FileRecord:
    record = opened.file(file_id)
    if record is None:
        raise ApiError(404, f"No such File object: {file_id}", param="id", code="not_found")
    return record


def _keep(opened: ApiStore, received: ReceivedUpload, max_bytes: int) -> FileRecord:
    with received.path.open("rb") as reader:
        return opened.add_file(
            reader, filename=received.filename, purpose="batch", max_bytes=max_bytes
        )


@files_router.post("")
async def upload_file(request: Request, opened: StoreDep) -> dict[str, Any]:
    """Upload a batch input file (multipart `purpose=batch`, `file`); too large: 413."""
    max_bytes = _settings_of(request).api_max_upload_bytes
    received = await receive_upload(request, opened.files_dir, max_bytes)
    try:
        if received.purpose != "batch":
            raise ApiError(400, "purpose must be 'batch'", param="purpose")
        # Hashing and copying up to the limit's bytes: off the event loop.
        record = await run_in_threadpool(_keep, opened, received, max_bytes)
    finally:
        received.path.unlink(missing_ok=True)
    return record.model_dump()


@files_router.get("")
def list_files(
    opened: StoreDep,
    purpose: str | None = None,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=10000)] = 10000,
) -> dict[str, Any]:
    """List the uploaded and generated files, newest first."""
    records = opened.files(purpose=purpose, after=after, limit=limit + 1)
    return _page([r.model_dump() for r in records[:limit]], len(records) > limit)


@files_router.get("/{file_id}")
def get_file(file_id: str, opened: StoreDep) -> dict[str, Any]:
    """A file object: its id, size, name and purpose."""
    return _file_found(opened, file_id).model_dump()


def _streamed(reader: BinaryIO) -> Iterator[bytes]:
    with reader:
        while chunk := reader.read(_CONTENT_CHUNK):
            yield chunk


@files_router.get("/{file_id}/content")
def file_content(file_id: str, opened: StoreDep) -> StreamingResponse:
    """The file's bytes: an input, or a batch's output or error lines."""
    record = _file_found(opened, file_id)
    # Opened here, not by path once the response starts: a delete in between cannot turn the
    # answer into a server error; bytes that are gone are a file that does not exist.
    try:
        reader = opened.blob_path(record).open("rb")
    except (FileContentMissingError, FileNotFoundError):
        raise ApiError(
            404,
            f"No such File object: {file_id} (its content is no longer stored)",
            param="id",
            code="not_found",
        ) from None
    size = os.fstat(reader.fileno()).st_size
    return StreamingResponse(
        _streamed(reader),
        media_type="application/octet-stream",
        headers={"Content-Length": str(size)},
        background=BackgroundTask(reader.close),  # a client gone midway: closed all the same
    )


@files_router.delete("/{file_id}")
def delete_file(file_id: str, opened: StoreDep) -> dict[str, Any]:
    """Delete a file."""
    _file_found(opened, file_id)
    opened.delete_file(file_id)
    return {"id": file_id, "object": "file", "deleted": True}


# ---- /v1/batches -----------------------------------------------------------------------------

COMPLETION_WINDOWS = {"24h": 24 * 3600}
# OpenAI's limits on a batch's metadata.
METADATA_PAIRS, METADATA_KEY_CHARS, METADATA_VALUE_CHARS = 16, 64, 512
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

batches_router = APIRouter(prefix="/v1/batches")


class BatchCreate(BaseModel):
    """The body of `POST /v1/batches`."""

    model_config = ConfigDict(extra="ignore")

    input_file_id: str = Field(
        min_length=1, max_length=200, description="The uploaded file of request lines."
    )
    endpoint: str = Field(
        max_length=200,
        description="`/v1/chat/completions`, `/v1/completions` or `/v1/responses`.",
    )
    completion_window: str = Field(max_length=20, description="`24h`.")
    metadata: dict[str, str] | None = Field(
        default=None, description="At most 16 pairs: keys up to 64, values up to 512 characters."
    )

    @field_validator("metadata")
    @classmethod
    def _openai_limits(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is None:
            return None
        if len(value) > METADATA_PAIRS:
            raise ValueError(f"at most {METADATA_PAIRS} pairs, got {len(value)}")
        if any(len(key) > METADATA_KEY_CHARS for key in value):
            raise ValueError(f"keys are at most {METADATA_KEY_CHARS} characters")
        if any(len(text) > METADATA_VALUE_CHARS for text in value.values()):
            raise ValueError(f"values are at most {METADATA_VALUE_CHARS} characters")
        return value


def _batch_object(settings: Settings, opened: ApiStore, batch: BatchRecord) -> dict[str, Any]:
    body: dict[str, Any] = {"object": "batch", **batch.model_dump(include=set(_BATCH_FIELDS))}
    body["status"] = batch.status.value
    body["errors"] = (
        {"object": "list", "data": [e.model_dump() for e in batch.errors]} if batch.errors else None
    )
    with Ledger(settings.paths.ledger_state) as ledger:
        body["request_counts"] = request_counts(opened, ledger, batch).model_dump()
    return body


def _batch_found(opened: ApiStore, batch_id: str) -> BatchRecord:
    batch = opened.batch(batch_id)
    if batch is None:
        raise ApiError(404, f"No such Batch object: {batch_id}", param="id", code="not_found")
    return batch


# The body is read by `json_body` (bounded while it streams), so it is named here for the schema.
_CREATE_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/BatchCreate"}}},
    }
}


def _endpoint_refused(endpoint: str) -> str:
    served = ", ".join(repr(url) for url in BATCH_ENDPOINTS)
    return f"endpoint {endpoint[:200]!r} is not supported; use one of {served}"


@batches_router.post("", openapi_extra=_CREATE_BODY)
def create_batch(
    request: Request,
    body: Annotated[BatchCreate, Depends(json_body(BatchCreate))],
    opened: StoreDep,
) -> dict[str, Any]:
    """Create a batch: it is `validating` at once; validated and landed, its run starts."""
    settings = _settings_of(request)
    if body.endpoint not in BATCH_ENDPOINTS:
        raise ApiError(400, _endpoint_refused(body.endpoint), param="endpoint")
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
    validator: BatchValidator = request.app.state.validator
    validator.submit(batch.id)  # returns at once, `validating`, as OpenAI's does
    return _batch_object(settings, opened, batch)


@batches_router.get("")
def list_batches(
    request: Request,
    opened: StoreDep,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> dict[str, Any]:
    """List the batches, newest first."""
    settings = _settings_of(request)
    records = opened.batches(after=after, limit=limit + 1)
    items = [_batch_object(settings, opened, r) for r in records[:limit]]
    return _page(items, len(records) > limit)


@batches_router.get("/{batch_id}")
def get_batch(request: Request, batch_id: str, opened: StoreDep) -> dict[str, Any]:
    """A batch: its status, request counts (from the ledger) and output and error files."""
    return _batch_object(_settings_of(request), opened, _batch_found(opened, batch_id))


@batches_router.post("/{batch_id}/cancel", dependencies=[Depends(no_body)])
def cancel_batch(request: Request, batch_id: str, opened: StoreDep) -> dict[str, Any]:
    """Cancel a batch: its requests in flight stop, the partial files are written."""
    batch = _batch_found(opened, batch_id)
    if batch.terminal:
        raise ApiError(409, f"batch {batch_id} is {batch.status.value}: it cannot be cancelled")
    if batch.status != BatchStatus.CANCELLING:
        batch = opened.update_batch(batch_id, status=BatchStatus.CANCELLING)
    return _batch_object(_settings_of(request), opened, batch)


# ---- the app ---------------------------------------------------------------------------------


def create_app(settings: Settings, access: ApiAccess) -> FastAPI:
    """The app for one deployment (its state dir and limits), answering as `access` allows."""
    app = FastAPI(title="kimi_batch Batch API", docs_url=None, redoc_url=None)
    install_error_handlers(app)
    app.state.settings = settings
    # Validation runs in worker threads, off the event loop; what a killed API process left
    # validating resumes now.
    app.state.validator = BatchValidator(settings)
    app.state.validator.resume()
    app.include_router(files_router)
    app.include_router(batches_router)
    app.add_middleware(Guard, access=access)
    app.openapi = lambda: _openapi(app)
    return app


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema plus the create body, which a dependency reads (bounded) instead of
    FastAPI, so FastAPI does not list it itself."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components["BatchCreate"] = BatchCreate.model_json_schema()
        app.openapi_schema = schema
    return app.openapi_schema
