"""A batch's way through the pipeline: validated and landed, counted live, its files written.

validate_batch     validating -> failed (errors naming the lines), or landed input of a
                   partition of its own (ds = the day it was created, source = the batch id)
batch_lines        the landed snapshot's requests (what a run answers, never the upload)
request_counts     total / completed / failed, read live from the ledger
write_batch_files  the output file (one line per answered request) and the error file (one
                   per request that failed, was set aside or was never answered)
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.engine import Ledger, row_request_id
from kimi_batch.settings import Settings
from kimi_batch.storage.api_store import ApiStore, BatchRecord, BatchStatus
from kimi_batch.storage.exceptions import StorageError
from kimi_batch.storage.landing import Assignment, Landing
from kimi_batch.tasks.openai_batch import (
    AnsweredRequest,
    BatchRequestLine,
    error_line,
    parse_batch_input,
    response_line,
)

__all__ = [
    "RequestCounts",
    "batch_lines",
    "request_counts",
    "validate_batch",
    "write_batch_files",
]


class RequestCounts(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    total: int = Field(ge=0)
    completed: int = Field(ge=0)
    failed: int = Field(ge=0)


def validate_batch(settings: Settings, store: ApiStore, batch: BatchRecord) -> BatchRecord:
    """Validate the input file; a valid one is landed as the batch's partition input."""
    upload = store.file(batch.input_file_id)
    if upload is None:
        raise StorageError(f"input file {batch.input_file_id} of {batch.id} is gone")
    with store.blob_path(upload).open("rb") as reader:
        parsed = parse_batch_input(reader, endpoint=batch.endpoint)
    if parsed.errors:
        return store.update_batch(
            batch.id,
            status=BatchStatus.FAILED,
            errors=parsed.errors,
            error_count=parsed.error_count,
        )
    ds = settings.today().isoformat()
    # Not recorded in the inbox manifest: the nightly and the inbox sensor never see a batch.
    assignment = Assignment(
        name=f"{batch.id}.jsonl",
        ds=ds,
        source=batch.id,
        first_seen=time.time(),
        dated_ds=None,
        refused=None,
    )
    with Landing(settings.paths) as landing:
        # The blob was written whole by the API store before this call: nothing to settle.
        version = landing.land(
            store.blob_path(upload),
            assignment,
            max_bytes=settings.max_input_bytes,
            ext="jsonl",
            settle_s=0.0,
        )
    return store.update_batch(
        batch.id,
        ds=ds,
        source=batch.id,
        input_sha256=version.sha256,
        request_total=len(parsed.lines),
    )


def batch_lines(settings: Settings, batch: BatchRecord) -> list[BatchRequestLine]:
    """The requests of a landed batch, read from its snapshot."""
    if batch.ds is None or batch.source is None:
        raise StorageError(f"batch {batch.id} has no landed input")
    with Landing(settings.paths) as landing:
        version = landing.current(batch.ds, batch.source)
    if version is None:
        raise StorageError(f"batch {batch.id}: no landed input for {batch.ds}|{batch.source}")
    with version.path.open("rb") as reader:
        parsed = parse_batch_input(reader, endpoint=batch.endpoint)
    if parsed.errors:
        raise StorageError(f"batch {batch.id}: landed input no longer validates")
    return parsed.lines


def request_counts(store: ApiStore, ledger: Ledger | None, batch: BatchRecord) -> RequestCounts:
    """Requests answered so far (the ledger) and those that failed (known at the end)."""
    keys = store.request_keys(batch.id)
    finished = ledger.finished_keys(set(keys.values())) if ledger is not None and keys else set()
    completed = sum(1 for key in keys.values() if key in finished)
    return RequestCounts(
        total=batch.request_total, completed=completed, failed=batch.request_failed
    )


def write_batch_files(
    store: ApiStore,
    ledger: Ledger,
    batch: BatchRecord,
    lines: Sequence[BatchRequestLine],
    *,
    set_aside: Mapping[str, tuple[str, str]],
    unanswered: tuple[str, str] | None,
) -> BatchRecord:
    """Write the output and error files and record their ids (and the failed count).

    `set_aside`: custom_id -> (code, reason) of requests that failed or were refused.
    `unanswered`: (code, reason) for the requests never answered (a cancelled or expired
    batch); None when every request was answered or set aside.
    """
    keys = store.request_keys(batch.id)
    results = ledger.get_many(keys.values())
    outputs: list[str] = []
    errors: list[str] = []
    for line in lines:
        key = keys.get(line.custom_id)
        result = results.get(key) if key else None
        request_id = row_request_id(key, line.custom_id) if key else None
        if result is not None and request_id is not None:
            answer = AnsweredRequest.from_result(
                result.model_copy(update={"request_id": request_id}), custom_id=line.custom_id
            )
            outputs.append(response_line(answer, top_logprobs=line.top_logprobs))
            continue
        reason = set_aside.get(line.custom_id) or unanswered
        if reason is not None:
            code, message = reason
            errors.append(
                error_line(
                    custom_id=line.custom_id, request_id=request_id, code=code, message=message
                )
            )
    output = (
        store.add_lines(outputs, filename=f"{batch.id}_output.jsonl", purpose="batch_output")
        if outputs
        else None
    )
    error = (
        store.add_lines(errors, filename=f"{batch.id}_error.jsonl", purpose="batch_output")
        if errors
        else None
    )
    return store.update_batch(
        batch.id,
        request_failed=len(errors),
        output_file_id=output.id if output else None,
        error_file_id=error.id if error else None,
    )
