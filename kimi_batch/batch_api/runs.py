"""Which batches need a run, and the batches whose run ended without finishing them, no Dagster.

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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Protocol

from pydantic import BaseModel, ConfigDict

from kimi_batch.batch_api.lifecycle import finish_batch, iter_batch_lines
from kimi_batch.batch_api.lines import BatchLineError
from kimi_batch.batch_api.store import ApiStore, BatchRecord, BatchStatus
from kimi_batch.batch_api.validation import resume_abandoned, validate_batch
from kimi_batch.engine import Ledger, PlannedRow
from kimi_batch.pipeline import BatchControls
from kimi_batch.settings import Settings
from kimi_batch.storage import StorageError

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
