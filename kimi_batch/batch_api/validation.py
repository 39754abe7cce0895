"""Validating a batch: a step of its own that ends it landed, failed or cancelled, even after a crash.

`POST /v1/batches` records the batch `validating` (claimed by the API process) and returns at
once, as OpenAI's does; `BatchValidator` validates it in a worker thread, off the event loop:

    validate_batch    stream the input (one line in memory, `batch_input`), then
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
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from kimi_batch.batch_api.batch_input import BatchScan, scan_batch_input, served_models
from kimi_batch.batch_api.lines import BatchLineError
from kimi_batch.batch_api.store import ApiStore, BatchRecord, BatchStatus, process_owner
from kimi_batch.settings import Settings
from kimi_batch.storage import Assignment, Landing

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
        """Validate again (in the workers) what a killed API process left `validating`."""
        self._pool.submit(self._resume)

    def _resume(self) -> None:
        if not ApiStore.exists(self.settings.paths):
            return
        with ApiStore(self.settings.paths) as store:
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
