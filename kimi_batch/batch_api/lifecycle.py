"""A batch's lifecycle past its creation, no Dagster: validated and landed (or failed), taken
up by its run, counted live, its files written, finished; and what a killed process or a run
that ended left behind, taken up again.

**Validation** is a step of its own that ends the batch landed, failed or cancelled, even after
a crash. `POST /v1/batches` records the batch `validating` (claimed by the API process) and
returns at once, as OpenAI's does; `BatchValidator` validates it in a worker thread, off the
event loop:

    validate_batch    stream the input (one line in memory, `lines`), then
                      land it as the input of a partition of its own (ds = the day it was
                      created, source = the batch id; the sensor starts its run), or fail it
                      with errors naming the lines; a batch cancelled meanwhile ends `cancelled`
    resume_abandoned  the batches whose validating process is gone (`ValidationClaim`):
                      validated again, or failed after `MAX_VALIDATION_ATTEMPTS`; a batch
                      cancelled before it was landed ends `cancelled` (it has no run to do it)

The API calls `resume_abandoned` when it starts (in its worker) and the API batch sensor on each
tick (inline), so no batch stays `validating` or `cancelling` because a process was killed.
Whatever goes wrong inside the step (a deleted input, a full disk) fails the batch with the
reason; it never leaves the batch behind.

**The run**:

    batch_lines        the landed snapshot's requests (what a run answers, never the upload)
    begin_batch        validated -> in_progress, unless a cancel (or the end) came first
    batch_controls     the run's controls: the batch's expiry, its cancel poll, its request keys
    request_counts     total / completed / failed, read live from the ledger
    write_batch_files  the output file (one line per answered request) and the error file (one
                       per request that failed, was set aside or was never answered)
    finish_batch       the files, then the final status; a cancel that arrived before the final
                       status was entered makes it `cancelled`; a final batch (a rerun by hand)
                       is left as it is, unless it ended without its files: they are written

Every status change is a compare-and-set (`ApiStore.transition`), so a cancel landing between
any two steps is honoured: the step after it sees that it did not move the batch.

`batches_to_run` is the one place that decides which batch needs a run, for the API batch
sensor and for `kimi-batch api`'s own launcher alike (a batch with a run already requested by
either is never asked for again). Each call first takes up what a killed process left behind
(`resume_abandoned`): a batch whose validation was abandoned (the API process died while or
before validating it) is validated again, and one cancelled before it was landed ends
`cancelled`, so no batch stays `validating` or `cancelling` for want of a process.

It also finalizes the batches whose run ended without finishing them (the run worker was
killed, run monitoring failed the run): a batch whose run is FAILURE or CANCELED while the
batch is not final would say `in_progress` forever. It becomes `failed` (an error names the
run) or `cancelled` (a cancel was asked), with its partial output and error files
(`finish_abandoned_batch`). The run answering a batch is the adapter's to find (`RunOf`).

**The stage** (`ApiBatchTask`): a batch's requests, answered as submitted, as `distilled` rows.
Its inputs are the batch's validated lines (from its landed snapshot, not from an upstream
table), its requests are theirs unchanged (no amplification), and only final answers become
rows: an empty answer, one cut off at max_tokens or one that is not the JSON its
`response_format` asked for is set aside with the reason. An answer that calls tools is final
(its `finish_reason` is `tool_calls`, its text may be empty): the calls are in its `tool_calls`
column. A completion line's row has its raw prompt as `prompt`. The client still gets every
answer in its output file (a cut-off one with `finish_reason: "length"`, as OpenAI returns it):
that file is written from the ledger, not from this table.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from functools import cached_property
from itertools import islice
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.batch_api.lines import (
    API_STAGE,
    AnsweredRequest,
    BatchLineError,
    BatchRequestLine,
    BatchScan,
    error_line,
    iter_batch_input,
    parse_batch_input,
    response_line,
    scan_batch_input,
    served_models,
)
from kimi_batch.batch_api.store import (
    ApiStore,
    BatchRecord,
    BatchStatus,
    LineStaging,
    process_owner,
)
from kimi_batch.engine import (
    BatchOutcome,
    GenerationRequest,
    GenerationResult,
    Ledger,
    PlannedRow,
    SystemDigest,
    row_request_id,
)
from kimi_batch.inputs import Assignment, Landing
from kimi_batch.llama import ToolCall
from kimi_batch.pipeline import (
    EMPTY_REASON,
    TRUNCATED_REASON,
    BatchControls,
    DistilledRow,
    GenerationColumns,
    GenerationTask,
    RowReader,
    SetAside,
    StagePlan,
    generation_columns,
)
from kimi_batch.settings import Settings
from kimi_batch.storage import StorageError

# ---- validation ------------------------------------------------------------------------------


MAX_VALIDATION_ATTEMPTS = 3
_BEAT_S = 5.0
_WORKERS = 2


def settle_cancelled(store: ApiStore, batch_id: str) -> BatchRecord | None:
    """A batch cancelled before it was landed has no run: `cancelling` -> `cancelled` here."""
    return store.transition(batch_id, BatchStatus.CANCELLED, expect=[BatchStatus.CANCELLING])


def _end(store: ApiStore, batch_id: str, errors: list[BatchLineError], count: int) -> BatchRecord:
    """Fail a `validating` batch with `errors`; one cancelled meanwhile ends cancelled."""
    failed = store.transition(
        batch_id,
        BatchStatus.FAILED,
        expect=[BatchStatus.VALIDATING],
        errors=errors,
        error_count=count,
    )
    final = failed or settle_cancelled(store, batch_id) or store.batch(batch_id)
    assert final is not None
    return final


def _landed(
    settings: Settings, store: ApiStore, batch: BatchRecord, scan: BatchScan
) -> BatchRecord:
    upload = store.file(batch.input_file_id)
    if upload is None:
        raise FileNotFoundError(f"the input file {batch.input_file_id} was deleted")
    # The day it was created, whenever it is validated (after midnight, resumed by a restart).
    ds = settings.today(datetime.fromtimestamp(batch.created_at, UTC)).isoformat()
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
        # The blob was written whole by the API store before the batch existed: nothing to settle.
        version = landing.land(
            store.blob_path(upload),
            assignment,
            max_bytes=settings.max_input_bytes,
            ext="jsonl",
            settle_s=0.0,
        )
    moved = store.transition(
        batch.id,
        None,
        expect=[BatchStatus.VALIDATING],
        ds=ds,
        source=batch.id,
        input_sha256=version.sha256,
        request_total=scan.request_total,
    )
    final = moved or settle_cancelled(store, batch.id) or store.batch(batch.id)
    assert final is not None
    return final


def _validate(
    settings: Settings, store: ApiStore, batch: BatchRecord, beat: Callable[[], None]
) -> BatchRecord:
    upload = store.file(batch.input_file_id)
    if upload is None:
        raise FileNotFoundError(f"the input file {batch.input_file_id} was deleted")
    with store.blob_path(upload).open("rb") as reader:
        scan = scan_batch_input(
            reader,
            endpoint=batch.endpoint,
            max_requests=settings.api_max_batch_requests,
            on_line=beat,
            models=served_models(settings),
        )
    if scan.errors:
        return _end(store, batch.id, scan.errors, scan.error_count)
    return _landed(settings, store, batch, scan)


def validate_batch(
    settings: Settings, store: ApiStore, batch: BatchRecord, *, owner: str | None = None
) -> BatchRecord:
    """The validation step of a `validating` batch (see the module); returns the batch after
    it. A batch another live process validates, or one past this step, is returned as it is."""
    owner = owner or process_owner()
    current = store.batch(batch.id)
    if current is None or current.status != BatchStatus.VALIDATING or current.input_sha256:
        if current is not None and current.status == BatchStatus.CANCELLING:
            current = settle_cancelled(store, batch.id) or current
        store.release_validation(batch.id)
        return current or batch
    claim = store.claim_validation(batch.id, owner)
    if claim is None:
        return current
    if claim.attempts > MAX_VALIDATION_ATTEMPTS:
        store.release_validation(batch.id)
        message = (
            f"validation was interrupted {claim.attempts - 1} times (the process validating the "
            "batch stopped each time); create the batch again"
        )
        return _end(
            store, batch.id, [BatchLineError(code="validation_interrupted", message=message)], 1
        )
    last = time.monotonic()

    def beat() -> None:
        nonlocal last
        if time.monotonic() - last > _BEAT_S:
            last = time.monotonic()
            store.beat_validation(batch.id, owner)

    try:
        return _validate(settings, store, current, beat)
    except Exception as error:  # the step must end the batch, whatever stopped it
        message = f"the batch could not be validated: {type(error).__name__}: {error}"
        return _end(store, batch.id, [BatchLineError(code="validation_error", message=message)], 1)
    finally:
        store.release_validation(batch.id)


def resume_abandoned(
    settings: Settings, store: ApiStore, *, validate: Callable[[BatchRecord], object]
) -> list[str]:
    """Hand every batch whose validation was abandoned to `validate`, and end `cancelled` the
    cancelled ones never landed; returns their ids."""
    now = time.time()
    found: list[str] = []
    for status in (BatchStatus.VALIDATING, BatchStatus.CANCELLING):
        for batch in store.batches(status=status):
            if batch.input_sha256 is not None:
                continue  # landed: the sensor's run takes it on
            claim = store.validation_claim(batch.id)
            if claim is not None and not claim.abandoned(now):
                continue
            found.append(batch.id)
            if status == BatchStatus.CANCELLING:
                settle_cancelled(store, batch.id)
                store.release_validation(batch.id)
            else:
                validate(batch)
    return found


class BatchValidator:
    """The API process's validation workers: `submit` a new batch, `resume` the abandoned ones
    (at start). Each worker opens its own store (SQLite connections are per thread)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._pool = ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix="batch-validate")
        self._queued: set[str] = set()
        self._lock = threading.Lock()

    def submit(self, batch_id: str) -> None:
        with self._lock:
            if batch_id in self._queued:
                return
            self._queued.add(batch_id)
        self._pool.submit(self._run, batch_id)

    def resume(self) -> None:
        """Validate again (in the workers) what a killed API process left `validating`, and
        remove the file bytes it left that no id names."""
        self._pool.submit(self._resume)

    def _resume(self) -> None:
        if not ApiStore.exists(self.settings.paths):
            return
        with ApiStore(self.settings.paths) as store:
            store.remove_unnamed_blobs()
            resume_abandoned(self.settings, store, validate=lambda batch: self.submit(batch.id))

    def _run(self, batch_id: str) -> None:
        try:
            with ApiStore(self.settings.paths) as store:
                batch = store.batch(batch_id)
                if batch is not None:
                    validate_batch(self.settings, store, batch)
        finally:
            with self._lock:
                self._queued.discard(batch_id)

    def shutdown(self, *, wait: bool = True) -> None:
        self._pool.shutdown(wait=wait)


# ---- the run ---------------------------------------------------------------------------------


CANCELLED_REASON = (
    "batch_cancelled",
    "the batch was cancelled before this request was answered",
)
EXPIRED_REASON = (
    "batch_expired",
    "the batch's completion window ended before this request was answered",
)
FAILED_REASON = ("batch_failed", "the batch's run failed before this request was answered")
_UNANSWERED = {
    BatchStatus.CANCELLED: CANCELLED_REASON,
    BatchStatus.EXPIRED: EXPIRED_REASON,
    BatchStatus.FAILED: FAILED_REASON,
}
# Answers read from the ledger at a time while the files are written (each may carry
# top-20 logprobs for every token: ~1 MiB of output line).
_FILE_CHUNK = 4
# The statuses a run's final status is entered from.
_IN_RUN = (BatchStatus.IN_PROGRESS, BatchStatus.FINALIZING)
_FINAL_FROM = {
    BatchStatus.COMPLETED: (BatchStatus.FINALIZING,),
    BatchStatus.EXPIRED: (BatchStatus.FINALIZING,),
    BatchStatus.CANCELLED: (BatchStatus.CANCELLING,),
    BatchStatus.FAILED: (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS, BatchStatus.FINALIZING),
}


class RequestCounts(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    total: int = Field(ge=0)
    completed: int = Field(ge=0)
    failed: int = Field(ge=0)


def _landed_limit(settings: Settings, batch: BatchRecord) -> int:
    """The request limit a landed input is read again with: the deployment's (its validation's),
    or the batch's own count if the limit was lowered since (a landed batch runs whole)."""
    return max(settings.api_max_batch_requests, batch.request_total)


def batch_lines(settings: Settings, batch: BatchRecord) -> list[BatchRequestLine]:
    """The requests of a landed batch, read from its snapshot."""
    with _snapshot(settings, batch).open("rb") as reader:
        parsed = parse_batch_input(
            reader, endpoint=batch.endpoint, max_requests=_landed_limit(settings, batch)
        )
    if parsed.errors:
        raise StorageError(
            f"batch {batch.id}: landed input no longer validates: {parsed.errors[0].message}"
        )
    return parsed.lines


def iter_batch_lines(settings: Settings, batch: BatchRecord) -> Iterator[BatchRequestLine]:
    """The requests of a landed batch one at a time, read from its snapshot as they are used
    (a finish outside the run: none of them is kept). StorageError as `batch_lines`."""
    path = _snapshot(settings, batch)
    with path.open("rb") as reader:
        try:
            yield from iter_batch_input(
                reader, endpoint=batch.endpoint, max_requests=_landed_limit(settings, batch)
            )
        except ValueError as error:
            raise StorageError(f"batch {batch.id}: landed input no longer validates") from error


def _snapshot(settings: Settings, batch: BatchRecord) -> Path:
    if batch.ds is None or batch.source is None:
        raise StorageError(f"batch {batch.id} has no landed input")
    with Landing(settings.paths) as landing:
        version = landing.readable(landing.current(batch.ds, batch.source))
    if version is None:
        raise StorageError(f"batch {batch.id}: no landed input for {batch.ds}|{batch.source}")
    return version.path


def request_counts(store: ApiStore, ledger: Ledger | None, batch: BatchRecord) -> RequestCounts:
    """Requests answered so far (the ledger) and those that failed (known at the end). A
    request a rerun by hand answered after the batch ended is no longer failed: completed and
    failed never add up past the total."""
    keys = store.request_keys(batch.id)
    finished = ledger.finished_keys(set(keys.values())) if ledger is not None and keys else set()
    completed = sum(1 for key in keys.values() if key in finished)
    failed = max(0, min(batch.request_failed, batch.request_total - completed))
    return RequestCounts(total=batch.request_total, completed=completed, failed=failed)


def write_batch_files(
    store: ApiStore,
    ledger: Ledger,
    batch: BatchRecord,
    lines: Iterable[BatchRequestLine],
    *,
    set_aside: Mapping[str, tuple[str, str]],
    unanswered: tuple[str, str] | None,
) -> BatchRecord:
    """Write the output and error files and record their ids (and the failed count).

    `set_aside`: custom_id -> (code, reason) of requests that failed or were refused.
    `unanswered`: (code, reason) for the requests never answered (a cancelled or expired
    batch); None when every request was answered or set aside.

    Streamed: `_FILE_CHUNK` answers at a time come from the ledger and go to the staged
    files, so the memory it takes does not grow with the batch (logprobs make an answer's
    output line tens of times its text).
    """
    keys = store.request_keys(batch.id)
    with store.stage_lines() as outputs, store.stage_lines() as errors:
        for chunk in _chunks(lines, _FILE_CHUNK):
            results = ledger.get_many(
                keys[line.custom_id] for line in chunk if line.custom_id in keys
            )
            for line in chunk:
                key = keys.get(line.custom_id)
                result = results.get(key) if key else None
                request_id = row_request_id(key, line.custom_id) if key else None
                if result is not None and request_id is not None:
                    outputs.write(_output_line(line, result, request_id))
                    continue
                reason = set_aside.get(line.custom_id) or unanswered
                if reason is not None:
                    code, message = reason
                    errors.write(
                        error_line(
                            custom_id=line.custom_id,
                            request_id=request_id,
                            code=code,
                            message=message,
                        )
                    )
            del results
        output_id = _kept(store, outputs, batch.id, "output")
        error_id = _kept(store, errors, batch.id, "error")
    return store.update_batch(
        batch.id, request_failed=errors.lines, output_file_id=output_id, error_file_id=error_id
    )


def _kept(
    store: ApiStore, staging: LineStaging, batch_id: str, kind: Literal["output", "error"]
) -> str | None:
    """The batch's output or error file kept (None: no line). Its id is derived from the batch:
    a finish stopped after keeping it and retried replaces that record rather than leave it
    beside a second one."""
    digest = hashlib.sha256(f"{batch_id}:{kind}".encode()).hexdigest()
    kept = store.keep_lines(
        staging,
        filename=f"{batch_id}_{kind}.jsonl",
        purpose="batch_output",
        file_id=f"file-{digest[:24]}",
    )
    return kept.id if kept else None


def _output_line(line: BatchRequestLine, result: GenerationResult, request_id: str) -> str:
    answer = AnsweredRequest.from_result(
        result.model_copy(update={"request_id": request_id}), custom_id=line.custom_id
    )
    return response_line(answer, top_logprobs=line.top_logprobs, kind=line.kind, params=line.params)


def _chunks(items: Iterable[BatchRequestLine], size: int) -> Iterator[list[BatchRequestLine]]:
    iterator = iter(items)
    while chunk := list(islice(iterator, size)):
        yield chunk


def begin_batch(
    store: ApiStore, batch_id: str, *, run_id: str, by_hand: bool
) -> BatchRecord | None:
    """Take a landed batch up: -> in_progress (a retry's in_progress or finalizing batch too).
    None when it was cancelled (or ended) first; a rerun `by_hand` of a finished batch keeps
    its status and goes on (it sends only what the ledger lacks)."""
    started = store.transition(
        batch_id,
        BatchStatus.IN_PROGRESS,
        expect=(BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS, BatchStatus.FINALIZING),
        run_id=run_id,
    )
    if started is not None:
        return started
    current = store.batch(batch_id)
    if by_hand and current is not None and current.terminal:
        return store.update_batch(batch_id, run_id=run_id)
    return None


def finish_batch(
    store: ApiStore,
    ledger: Ledger,
    batch_id: str,
    lines: Iterable[BatchRequestLine],
    status: BatchStatus,
    *,
    outcomes: Sequence[BatchOutcome] = (),
) -> BatchRecord:
    """Write the output/error files, then enter `status` (never over a final one). A batch
    being cancelled ends `cancelled`, whatever `status` the run reached. A final batch (a
    rerun by hand) keeps its status and its files; one that ended without them gets them now.
    `lines` is read once (an iterator from `iter_batch_lines` will do)."""
    current = store.batch(batch_id)
    if current is None:
        raise StorageError(f"no batch {batch_id}")
    failed = {f.input_id: ("request_failed", f.reason) for o in outcomes for f in o.failures}
    if current.terminal:
        if current.output_file_id is not None or current.error_file_id is not None:
            return current  # a final batch's files never change (a client may hold them)
        # Ended without its files (`finish_failed`): the answers kept in the ledger, this
        # rerun's too, are written now, each request in one file as its final status says.
        unanswered = _UNANSWERED.get(current.status)
        return write_batch_files(
            store, ledger, current, lines, set_aside=failed, unanswered=unanswered
        )
    if status == BatchStatus.CANCELLED or current.status == BatchStatus.CANCELLING:
        status = BatchStatus.CANCELLED
        store.transition(batch_id, BatchStatus.CANCELLING)
    elif (
        status in (BatchStatus.COMPLETED, BatchStatus.EXPIRED)
        # Finalizing before the files: a cancel until the final status still counts.
        and store.transition(batch_id, BatchStatus.FINALIZING, expect=_IN_RUN) is None
    ):
        return finish_batch(store, ledger, batch_id, lines, BatchStatus.CANCELLED)
    record = write_batch_files(
        store, ledger, current, lines, set_aside=failed, unanswered=_UNANSWERED.get(status)
    )
    done = store.transition(batch_id, status, expect=_FINAL_FROM[status])
    if done is None:
        # Cancelled while the files were written: they hold every answer there is.
        done = store.transition(batch_id, BatchStatus.CANCELLED, expect=[BatchStatus.CANCELLING])
    return done or store.batch(batch_id) or record


# Starts of an abandoned batch's finish before it ends without its files (each start that
# never ended was a process killed while writing them).
MAX_FINISH_ATTEMPTS = 3
# Statuses a batch holds while a run is (or should be) working on it.
_UNFINISHED = (
    BatchStatus.VALIDATING,
    BatchStatus.IN_PROGRESS,
    BatchStatus.FINALIZING,
    BatchStatus.CANCELLING,
)


class BatchRunState(BaseModel):
    """The run answering a batch, as far as the batch's bookkeeping needs it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str
    status: str  # as the orchestrator names it (FAILURE, CANCELED, ...), for the messages
    ended: bool = False  # failed or canceled: it will not finish the batch
    cancelled: bool = False  # canceled (a terminate from the UI, or the API's cancel)
    will_retry: bool = False  # a retry of the run takes the batch up again


# The run answering a batch: the one that took it up, else the newest requested for it.
RunOf = Callable[[BatchRecord], BatchRunState | None]


class RunLog(Protocol):
    """Where a warning goes: the sensor's log, or the API process's logger."""

    def warning(self, msg: str) -> None: ...


def finish_abandoned_batch(
    settings: Settings, store: ApiStore, batch: BatchRecord, run: BatchRunState
) -> BatchRecord:
    """Finalize a batch whose run ended without doing it (its processes were killed, run
    monitoring failed it): `cancelled` when a cancel was asked (the API's, or a terminate from
    the UI), else `failed` with an error naming the run; the partial output and error files
    come from the ledger either way, streamed from the landed input. A finish that was begun
    `MAX_FINISH_ATTEMPTS` times and never ended (its process killed each time) is not tried
    again: the final status without files, an error saying why."""
    cancel_asked = batch.status == BatchStatus.CANCELLING or run.cancelled
    status = BatchStatus.CANCELLED if cancel_asked else BatchStatus.FAILED
    attempts = store.count_finish_attempt(batch.id)
    if status == BatchStatus.FAILED:
        message = (
            f"the batch's run {run.run_id} ended {run.status} before the batch was "
            "finished; its answered requests are in the output file"
        )
        batch = _with_error(store, batch, BatchLineError(code="run_failed", message=message))
    if attempts > MAX_FINISH_ATTEMPTS:
        message = (
            f"writing the output and error files stopped {attempts - 1} times (the process "
            "ended, out of memory?); the answers are kept: a rerun of the batch writes them"
        )
        batch = _with_error(store, batch, BatchLineError(code="finish_failed", message=message))
        return _final_without_files(store, batch, status)
    try:
        with Ledger(settings.paths.ledger_state) as ledger:
            return finish_batch(store, ledger, batch.id, iter_batch_lines(settings, batch), status)
    except StorageError:
        # The landed input is gone or unreadable: the final status without files.
        return _final_without_files(store, batch, status)


def _final_without_files(store: ApiStore, batch: BatchRecord, status: BatchStatus) -> BatchRecord:
    if status == BatchStatus.CANCELLED:
        store.transition(batch.id, BatchStatus.CANCELLING)  # the only way into `cancelled`
    return store.update_batch(batch.id, status=status)


def _with_error(store: ApiStore, batch: BatchRecord, error: BatchLineError) -> BatchRecord:
    """`error` added to the batch's errors once (a retried finish does not repeat it)."""
    if error in batch.errors:
        return batch
    return store.update_batch(batch.id, errors=[*batch.errors, error])


def cancelled_message(done: BatchRecord) -> str:
    """What a run says of its batch, cancelled by the user."""
    answered = done.request_total - done.request_failed
    return (
        f"{done.id} was cancelled: {answered} of {done.request_total} requests answered "
        "(kept; a rerun sends the rest)"
    )


def batch_controls(store: ApiStore, batch: BatchRecord) -> BatchControls:
    """The batch's expiry as the stop time, the user's cancel polled, the request keys stored
    before the first request is sent (the live counts and the files read them)."""

    def cancel_asked() -> bool:
        record = store.batch(batch.id)
        return record is not None and record.status == BatchStatus.CANCELLING

    def planned(rows: Sequence[PlannedRow]) -> None:
        store.set_request_keys(batch.id, [(row.input_id, row.content_key) for row in rows])

    return BatchControls(
        expires_at=datetime.fromtimestamp(batch.expires_at, UTC),
        cancelled=cancel_asked,
        on_planned=planned,
    )


def _finish_abandoned(settings: Settings, store: ApiStore, run_of: RunOf, log: RunLog) -> None:
    """Finalize each unfinished batch whose run has ended (see the module)."""
    for status in _UNFINISHED:
        for batch in store.batches(status=status):
            run = run_of(batch)
            if run is None or not run.ended or run.will_retry:
                continue  # running, or its retry takes the batch up again
            done = finish_abandoned_batch(settings, store, batch, run)
            log.warning(
                f"{batch.id}: its run {run.run_id} ended {run.status} with the batch "
                f"{batch.status.value}; the batch is now {done.status.value}"
            )


def batches_to_run(settings: Settings, run_of: RunOf, log: RunLog) -> list[BatchRecord]:
    """What a killed process left taken up, batches whose run ended finalized, and the
    validated (or cancelled) batches with no run yet returned (see the module)."""
    if not ApiStore.exists(settings.paths):
        return []
    with ApiStore(settings.paths) as store:
        resumed = resume_abandoned(
            settings, store, validate=lambda batch: validate_batch(settings, store, batch)
        )
        for batch_id in resumed:
            log.warning(
                f"{batch_id}: the process validating it stopped; validated again or finished here"
            )
        _finish_abandoned(settings, store, run_of, log)
        # A batch with a run requested (queued, or launched by the other launcher) has its run:
        # whichever of the daemon and the API asks first, the other never asks again.
        return [
            batch
            for status in (BatchStatus.VALIDATING, BatchStatus.CANCELLING)
            for batch in store.batches(status=status)
            if batch.input_sha256 is not None and batch.run_id is None and run_of(batch) is None
        ]


# ---- the stage: a batch's lines answered as distilled rows -----------------------------------


NOT_JSON_REASON = "answer is not the JSON its response_format asked for"


class ApiBatchInputs(BaseModel):
    """A batch's validated lines, by `custom_id`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    batch_id: str
    lines: list[BatchRequestLine]
    source_file: str

    @cached_property
    def by_id(self) -> dict[str, BatchRequestLine]:
        return {line.custom_id: line for line in self.lines}

    @cached_property
    def system_prompts(self) -> dict[str, SystemDigest]:
        """Each distinct system text of the batch as a digest ('' included: no system turn)."""
        return {
            text: SystemDigest.from_text(text, path=f"{self.batch_id} system prompt")
            for text in dict.fromkeys(line.system for line in self.lines)
        }

    def request(self, line: BatchRequestLine) -> GenerationRequest:
        """The line's request with its system prompt as its own digest, its own sample (batch
        id + `custom_id`) unless its answer is determined: the same line in another batch is
        sampled anew, a rerun finds its answer."""
        return line.request().model_copy(
            update={"sample_scope": self.batch_id, "digest": self.system_prompts[line.system]}
        )


def _tool_calls_json(calls: list[ToolCall]) -> str:
    return json.dumps([call.model_dump(mode="json") for call in calls], ensure_ascii=False)


def _tools_json(tools: list[dict[str, Any]] | None) -> str | None:
    """The request's tools kept with its answer, so a training export can give them back."""
    return json.dumps(tools, ensure_ascii=False) if tools else None


def _structured(text: str) -> str | None:
    """Canonical JSON of an answer asked for as JSON; None when it is not JSON that a row can
    hold. Besides a parse error, `json.loads` raises RecursionError on a deep nest (a model
    looping inside a JSON grammar), ValueError on an integer past 4,300 digits, and reads a
    `\\udXXX` escape with no pair as a lone surrogate the table's UTF-8 cannot store: one such
    answer is its line's, not the whole batch's failure."""
    try:
        # allow_nan=False: 1e999 reads as infinity, which plain dumps writes as `Infinity`,
        # text that is not JSON (a ValueError here: not structured).
        value = json.loads(text)
        canonical = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        canonical.encode()
    except (ValueError, RecursionError):
        return None
    return canonical


class ApiBatchTask(GenerationTask[ApiBatchInputs, DistilledRow]):
    """A Batch API batch (table `distilled`, partition ds=<day created>/source=<batch id>)."""

    name: ClassVar[str] = API_STAGE
    table: ClassVar[str] = "distilled"
    row_model: ClassVar[type[GenerationColumns]] = DistilledRow

    batch_id: str = Field(min_length=1, description="The batch's id (its lines' sample scope).")
    lines: list[BatchRequestLine] = Field(description="The batch's validated requests.")
    source_file: str = Field(description="The batch's landed input, as quarantine names it.")

    def load(self, read: RowReader) -> ApiBatchInputs:
        return ApiBatchInputs(
            batch_id=self.batch_id, lines=self.lines, source_file=self.source_file
        )

    def requests(self, inputs: ApiBatchInputs) -> list[GenerationRequest]:
        return [inputs.request(line) for line in inputs.lines]

    def plan(self, ds: str, source: str, input_sha: str | None) -> StagePlan:
        """The batch as a stage's partition: its lines, landed at ds/source from `input_sha`."""
        inputs = self.load(lambda table, model: [])  # the lines are the inputs: no table read
        return StagePlan(
            task=self,
            ds=ds,
            source=source,
            inputs=inputs,
            requests=self.requests(inputs),
            input_sha=input_sha or "",
        )

    def parse(self, result: GenerationResult, inputs: ApiBatchInputs) -> DistilledRow | SetAside:
        """A result of no line of the batch is a caller bug and raises ValueError."""
        line = inputs.by_id.get(result.input_id)
        if line is None:
            raise ValueError(f"result {result.request_id} is for no request of the batch")
        response = result.text.strip()
        asked_json = line.params.json_schema is not None
        structured = _structured(response) if asked_json else None
        calls = result.tool_calls
        reason = (
            EMPTY_REASON
            if result.empty
            else TRUNCATED_REASON
            if result.truncated
            else NOT_JSON_REASON
            if asked_json and structured is None and not calls
            else None
        )
        if reason is not None:
            return SetAside(reason=reason, source_file=inputs.source_file, line=line.line)
        return DistilledRow.model_validate(
            {
                **generation_columns(result),
                "seed_id": line.custom_id,
                "origin": "seed",
                "strategy": None,
                "prompt": line.prompt,
                "response": response,
                "reasoning": result.reasoning_content or None,
                "structured": structured,
                "logprobs": result.logprobs,
                "tool_calls": _tool_calls_json(calls) if calls else None,
                "tools": _tools_json(line.params.tools),
            }
        )
