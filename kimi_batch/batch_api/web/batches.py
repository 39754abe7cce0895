"""`/v1/batches`: create (validation and landing follow in a worker), list, retrieve, cancel.

Creating a batch records it `validating` and returns; a worker validates its input file as it
streams (the whole batch fails, with errors naming the lines, on a bad one) and lands it as the
input of a partition of its own; the API batch sensor starts
its Dagster run. Its `request_counts` are read from the ledger on every retrieve. Cancel marks
it `cancelling`: the run stops the requests in flight, writes the partial output and error
files and marks it `cancelled`.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, ConfigDict, Field, field_validator

from kimi_batch.batch_api import (
    BATCH_ENDPOINTS,
    ApiStore,
    BatchRecord,
    BatchStatus,
    BatchValidator,
    request_counts,
)
from kimi_batch.batch_api.web.bodies import json_body, no_body
from kimi_batch.batch_api.web.dependencies import StoreDep, page, settings_of
from kimi_batch.batch_api.web.errors import ApiError
from kimi_batch.engine import Ledger
from kimi_batch.settings import Settings

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

router = APIRouter(prefix="/v1/batches")


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


def _found(opened: ApiStore, batch_id: str) -> BatchRecord:
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


@router.post("", openapi_extra=_CREATE_BODY)
def create_batch(
    request: Request,
    body: Annotated[BatchCreate, Depends(json_body(BatchCreate))],
    opened: StoreDep,
) -> dict[str, Any]:
    """Create a batch: it is `validating` at once; validated and landed, its run starts."""
    settings = settings_of(request)
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


@router.get("")
def list_batches(
    request: Request,
    opened: StoreDep,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> dict[str, Any]:
    """List the batches, newest first."""
    settings = settings_of(request)
    records = opened.batches(after=after, limit=limit + 1)
    items = [_batch_object(settings, opened, r) for r in records[:limit]]
    return page(items, len(records) > limit)


@router.get("/{batch_id}")
def get_batch(request: Request, batch_id: str, opened: StoreDep) -> dict[str, Any]:
    """A batch: its status, request counts (from the ledger) and output and error files."""
    return _batch_object(settings_of(request), opened, _found(opened, batch_id))


@router.post("/{batch_id}/cancel", dependencies=[Depends(no_body)])
def cancel_batch(request: Request, batch_id: str, opened: StoreDep) -> dict[str, Any]:
    """Cancel a batch: its requests in flight stop, the partial files are written."""
    batch = _found(opened, batch_id)
    if batch.terminal:
        raise ApiError(409, f"batch {batch_id} is {batch.status.value}: it cannot be cancelled")
    if batch.status != BatchStatus.CANCELLING:
        batch = opened.update_batch(batch_id, status=BatchStatus.CANCELLING)
    return _batch_object(settings_of(request), opened, batch)
