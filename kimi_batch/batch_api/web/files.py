"""`/v1/files`: upload (streamed, bounded), list, retrieve, content, delete."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse
from starlette.concurrency import run_in_threadpool

from kimi_batch.batch_api import ApiStore, FileRecord
from kimi_batch.batch_api.web.dependencies import StoreDep, page, settings_of
from kimi_batch.batch_api.web.errors import ApiError
from kimi_batch.batch_api.web.upload import ReceivedUpload, receive_upload

router = APIRouter(prefix="/v1/files")


def _found(opened: ApiStore, file_id: str) -> FileRecord:
    record = opened.file(file_id)
    if record is None:
        raise ApiError(404, f"No such File object: {file_id}", param="id", code="not_found")
    return record


def _keep(opened: ApiStore, received: ReceivedUpload, max_bytes: int) -> FileRecord:
    with received.path.open("rb") as reader:
        return opened.add_file(
            reader, filename=received.filename, purpose="batch", max_bytes=max_bytes
        )


@router.post("")
async def upload_file(request: Request, opened: StoreDep) -> dict[str, Any]:
    """Upload a batch input file (multipart `purpose=batch`, `file`); too large: 413."""
    max_bytes = settings_of(request).api_max_upload_bytes
    received = await receive_upload(request, opened.files_dir, max_bytes)
    try:
        if received.purpose != "batch":
            raise ApiError(400, "purpose must be 'batch'", param="purpose")
        # Hashing and copying up to the limit's bytes: off the event loop.
        record = await run_in_threadpool(_keep, opened, received, max_bytes)
    finally:
        received.path.unlink(missing_ok=True)
    return record.model_dump()


@router.get("")
def list_files(
    opened: StoreDep,
    purpose: str | None = None,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=10000)] = 10000,
) -> dict[str, Any]:
    """List the uploaded and generated files, newest first."""
    records = opened.files(purpose=purpose, after=after, limit=limit + 1)
    return page([r.model_dump() for r in records[:limit]], len(records) > limit)


@router.get("/{file_id}")
def get_file(file_id: str, opened: StoreDep) -> dict[str, Any]:
    """A file object: its id, size, name and purpose."""
    return _found(opened, file_id).model_dump()


@router.get("/{file_id}/content")
def file_content(file_id: str, opened: StoreDep) -> FileResponse:
    """The file's bytes: an input, or a batch's output or error lines."""
    record = _found(opened, file_id)
    return FileResponse(opened.blob_path(record), media_type="application/octet-stream")


@router.delete("/{file_id}")
def delete_file(file_id: str, opened: StoreDep) -> dict[str, Any]:
    """Delete a file."""
    _found(opened, file_id)
    opened.delete_file(file_id)
    return {"id": file_id, "object": "file", "deleted": True}
