"""The Batch API's batches: their records and lifecycle, shared by `kimi-batch api` and the runs.

    api/api.sqlite3      batch records, each batch's request keys (and the files: `file_store`);
                         the `kimi_api` schema of KIMI_BATCH_DATABASE_URL when it is set

Batch records move only forward through the lifecycle (`BatchStatus`, `NEXT_STATUSES`). Every
status change is a compare-and-set (`transition`): it happens only from the statuses the caller
expects and says whether it did, so a cancel landing between two steps of a run is never
overwritten by the run's next step. The API process and a Dagster run both update batches; each
change is one write transaction.
"""

from __future__ import annotations

import io
import os
import socket
import time
import uuid
from collections.abc import Collection, Iterable
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.batch_api.file_store import ApiFileStore
from kimi_batch.batch_api.lines import BatchLineError
from kimi_batch.crash_points import crash_point
from kimi_batch.paths import StatePaths
from kimi_batch.storage import StorageError, pid_alive

# A validator beats every few seconds while it reads; one silent this long is gone (only for an
# owner on another host: on this one, its pid tells).
VALIDATION_STALE_S = 600.0
_DAY_S = 86400  # the completion window of a "24h" batch, the only one OpenAI offers

_SCHEMA = (
    """
    CREATE TABLE IF NOT EXISTS batches (
        seq        {serial},
        id         TEXT NOT NULL UNIQUE,
        status     TEXT NOT NULL,
        record     TEXT NOT NULL
    )
    """,
    # Who validates a `validating` batch not landed yet (see `ValidationClaim`).
    """
    CREATE TABLE IF NOT EXISTS validations (
        batch_id   TEXT PRIMARY KEY,
        owner      TEXT NOT NULL,
        heartbeat  {real} NOT NULL,
        attempts   {int} NOT NULL
    )
    """,
    # How many times a batch's finish was begun outside its run (`count_finish_attempt`).
    """
    CREATE TABLE IF NOT EXISTS finish_attempts (
        batch_id   TEXT PRIMARY KEY,
        attempts   {int} NOT NULL
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS batch_requests (
        batch_id    TEXT NOT NULL,
        custom_id   TEXT NOT NULL,
        content_key TEXT NOT NULL,
        PRIMARY KEY (batch_id, custom_id)
    )
    """,
)


class BatchStatus(StrEnum):
    VALIDATING = "validating"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"


TERMINAL_STATUSES = frozenset(
    {BatchStatus.FAILED, BatchStatus.COMPLETED, BatchStatus.EXPIRED, BatchStatus.CANCELLED}
)
# The lifecycle: the statuses each one may move to. A cancelled batch never runs again
# (cancelling -> cancelled only); a finished one never changes.
NEXT_STATUSES: dict[BatchStatus, frozenset[BatchStatus]] = {
    BatchStatus.VALIDATING: frozenset(
        {BatchStatus.IN_PROGRESS, BatchStatus.FAILED, BatchStatus.CANCELLING}
    ),
    BatchStatus.IN_PROGRESS: frozenset(
        {BatchStatus.FINALIZING, BatchStatus.EXPIRED, BatchStatus.FAILED, BatchStatus.CANCELLING}
    ),
    BatchStatus.FINALIZING: frozenset(
        {BatchStatus.COMPLETED, BatchStatus.EXPIRED, BatchStatus.FAILED, BatchStatus.CANCELLING}
    ),
    BatchStatus.CANCELLING: frozenset({BatchStatus.CANCELLED}),
}
# The timestamp field each status sets when it is entered.
_STAMPS = {
    BatchStatus.IN_PROGRESS: "in_progress_at",
    BatchStatus.FINALIZING: "finalizing_at",
    BatchStatus.COMPLETED: "completed_at",
    BatchStatus.FAILED: "failed_at",
    BatchStatus.EXPIRED: "expired_at",
    BatchStatus.CANCELLING: "cancelling_at",
    BatchStatus.CANCELLED: "cancelled_at",
}


class BatchRecord(BaseModel):
    """A batch: OpenAI's batch object fields, and where it runs (`ds`, `source`, `run_id`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    endpoint: str
    input_file_id: str
    completion_window: str
    status: BatchStatus
    metadata: dict[str, str] | None = None
    errors: list[BatchLineError] = Field(default_factory=list)
    error_count: int = 0
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    expires_at: int
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_total: int = 0
    request_failed: int = Field(default=0, description="Set at the end: failed or set aside.")
    ds: str | None = Field(default=None, description="Date partition of its output rows.")
    source: str | None = Field(default=None, description="Source partition (the batch's own).")
    input_sha256: str | None = Field(default=None, description="The landed input snapshot.")
    run_id: str | None = Field(default=None, description="The Dagster run answering it.")
    cache_hit_ratio: float | None = None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES


def process_owner() -> str:
    """This process, as a validation claim names it: `host:pid`."""
    return f"{socket.gethostname()}:{os.getpid()}"


class ValidationClaim(BaseModel):
    """The process validating a batch (its creator from the start), its last sign of life and
    how many processes have started on it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    batch_id: str
    owner: str
    heartbeat: float
    attempts: int = Field(ge=0)

    def abandoned(self, now: float) -> bool:
        """Its owner is gone: a dead pid on this host, else no beat for `VALIDATION_STALE_S`."""
        host, _, pid = self.owner.rpartition(":")
        if host == socket.gethostname() and pid.isdigit():
            return not pid_alive(int(pid))
        return now - self.heartbeat > VALIDATION_STALE_S


class ApiStore(ApiFileStore):
    """Files and batches of the Batch API under `StatePaths.api_dir`."""

    def __init__(self, paths: StatePaths) -> None:
        super().__init__(paths)
        self._db.create(_SCHEMA)

    def __enter__(self) -> ApiStore:
        return self

    # ---- batches -----------------------------------------------------------------------------

    def add_upload_batch(
        self,
        data: bytes,
        *,
        endpoint: str = "/v1/chat/completions",
        owner: str | None = None,
        filename: str = "in.jsonl",
    ) -> BatchRecord:
        """`data` uploaded and made a 24-hour batch, as a client's files.create and then
        batches.create make one (the bench and tests land batches this way)."""
        upload = self.add_file(
            io.BytesIO(data), filename=filename, purpose="batch", max_bytes=len(data)
        )
        return self.add_batch(
            input_file_id=upload.id,
            endpoint=endpoint,
            completion_window="24h",
            completion_window_s=_DAY_S,
            metadata=None,
            owner=owner,
        )

    def add_batch(
        self,
        *,
        input_file_id: str,
        endpoint: str,
        completion_window_s: int,
        completion_window: str,
        metadata: dict[str, str] | None,
        owner: str | None = None,
    ) -> BatchRecord:
        """A new `validating` batch, its validation claimed by `owner` (default: this process)."""
        now = int(time.time())
        record = BatchRecord(
            id=f"batch_{uuid.uuid4().hex[:24]}",
            endpoint=endpoint,
            input_file_id=input_file_id,
            completion_window=completion_window,
            status=BatchStatus.VALIDATING,
            metadata=metadata,
            created_at=now,
            expires_at=now + completion_window_s,
        )
        with self._write_lock():
            self._db.execute(
                "INSERT INTO batches (id, status, record) VALUES (?, ?, ?)",
                (record.id, record.status.value, record.model_dump_json()),
            )
            # Claimed by its creator at once: killed before validating, it is found abandoned.
            self._db.execute(
                "INSERT INTO validations (batch_id, owner, heartbeat, attempts) VALUES (?, ?, ?, 0)",
                (record.id, owner or process_owner(), time.time()),
            )
        crash_point("api.batch_added")
        return record

    def batch(self, batch_id: str) -> BatchRecord | None:
        row = self._db.execute("SELECT record FROM batches WHERE id = ?", (batch_id,)).fetchone()
        return BatchRecord.model_validate_json(row[0]) if row else None

    def batches(
        self, *, after: str | None = None, limit: int = 10000, status: BatchStatus | None = None
    ) -> list[BatchRecord]:
        rows = self._page("batches", after=after, limit=limit, status=status and status.value)
        return [BatchRecord.model_validate_json(row[-1]) for row in rows]

    def transition(
        self,
        batch_id: str,
        status: BatchStatus | None,
        *,
        expect: Collection[BatchStatus] | None = None,
        **fields: Any,
    ) -> BatchRecord | None:
        """Compare-and-set: if the batch is in one of `expect` (default: every status from which
        the lifecycle allows `status`), enter `status` (stamping its time; None: keep it) and
        set `fields`. Returns the new record, or None when the batch was elsewhere (nothing is
        changed then)."""
        if expect is None:
            if status is None:
                raise ValueError("a fields-only transition needs the statuses it expects")
            expect = [s for s, after in NEXT_STATUSES.items() if status in after]
        with self._write_lock():
            record = self._record(batch_id)
            if record.status not in expect:
                return None
            update = dict(fields)
            if status is not None and status != record.status:
                update["status"] = status
                if (stamp := _STAMPS.get(status)) is not None:
                    update[stamp] = int(time.time())
            moved = BatchRecord.model_validate({**record.model_dump(), **update})
            # WHERE status = the one read: the compare-and-set itself (the lock makes it
            # certain here; it keeps the statement right where no such lock is held).
            cursor = self._db.execute(
                "UPDATE batches SET status = ?, record = ? WHERE id = ? AND status = ?",
                (moved.status.value, moved.model_dump_json(), batch_id, record.status.value),
            )
        crash_point("api.batch_transitioned")
        return moved if cursor.rowcount == 1 else None

    def update_batch(
        self, batch_id: str, *, status: BatchStatus | None = None, **fields: Any
    ) -> BatchRecord:
        """Set `fields` whatever the status; with `status`, also enter it when the lifecycle
        allows it from the current one (a finished or cancelling batch keeps its status). A
        step that must not happen after another writer's change uses `transition`."""
        with self._write_lock():
            record = self._record(batch_id)
            update = dict(fields)
            if status is not None and status in NEXT_STATUSES.get(record.status, ()):
                update["status"] = status
                if (stamp := _STAMPS.get(status)) is not None:
                    update[stamp] = int(time.time())
            record = BatchRecord.model_validate({**record.model_dump(), **update})
            self._db.execute(
                "UPDATE batches SET status = ?, record = ? WHERE id = ?",
                (record.status.value, record.model_dump_json(), batch_id),
            )
        crash_point("api.batch_updated")
        return record

    def _record(self, batch_id: str) -> BatchRecord:
        row = self._db.execute("SELECT record FROM batches WHERE id = ?", (batch_id,)).fetchone()
        if row is None:
            raise StorageError(f"no batch {batch_id}")
        return BatchRecord.model_validate_json(row[0])

    # ---- validation claims -------------------------------------------------------------------

    def validation_claim(self, batch_id: str) -> ValidationClaim | None:
        row = self._db.execute(
            "SELECT batch_id, owner, heartbeat, attempts FROM validations WHERE batch_id = ?",
            (batch_id,),
        ).fetchone()
        return _claim(row) if row else None

    def claim_validation(self, batch_id: str, owner: str) -> ValidationClaim | None:
        """Take the validation of a batch: unclaimed, already `owner`'s, or abandoned. The
        claim counts one more attempt; None when a live process holds it."""
        with self._write_lock():
            now = time.time()
            held = self.validation_claim(batch_id)
            if held is not None and held.owner != owner and not held.abandoned(now):
                return None
            attempts = (held.attempts if held else 0) + 1
            self._db.execute(
                "INSERT INTO validations (batch_id, owner, heartbeat, attempts) "
                "VALUES (?, ?, ?, ?) ON CONFLICT (batch_id) DO UPDATE SET "
                "owner = excluded.owner, heartbeat = excluded.heartbeat, "
                "attempts = excluded.attempts",
                (batch_id, owner, now, attempts),
            )
        crash_point("api.validation_claimed")
        return ValidationClaim(batch_id=batch_id, owner=owner, heartbeat=now, attempts=attempts)

    def beat_validation(self, batch_id: str, owner: str) -> None:
        self._db.execute(
            "UPDATE validations SET heartbeat = ? WHERE batch_id = ? AND owner = ?",
            (time.time(), batch_id, owner),
        )

    def release_validation(self, batch_id: str) -> None:
        self._db.execute("DELETE FROM validations WHERE batch_id = ?", (batch_id,))

    def count_finish_attempt(self, batch_id: str) -> int:
        """Count one more start of the batch's finish after its run ended; the count so far.
        (A finish killed each time, for memory say, must not be retried on every tick.)"""
        with self._write_lock():
            self._db.execute(
                "INSERT INTO finish_attempts (batch_id, attempts) VALUES (?, 1) "
                "ON CONFLICT (batch_id) DO UPDATE SET attempts = finish_attempts.attempts + 1",
                (batch_id,),
            )
            row = self._db.execute(
                "SELECT attempts FROM finish_attempts WHERE batch_id = ?", (batch_id,)
            ).fetchone()
        crash_point("api.finish_attempt")
        return int(row[0])

    # ---- request keys --------------------------------------------------------------------------

    def set_request_keys(self, batch_id: str, keys: Iterable[tuple[str, str]]) -> None:
        """(custom_id, ledger content key) of every request of the batch, as planned."""
        self._db.executemany(
            "INSERT INTO batch_requests (batch_id, custom_id, content_key) VALUES (?, ?, ?) "
            "ON CONFLICT (batch_id, custom_id) DO UPDATE SET content_key = excluded.content_key",
            [(batch_id, custom_id, key) for custom_id, key in keys],
        )

    def request_keys(self, batch_id: str) -> dict[str, str]:
        rows = self._db.execute(
            "SELECT custom_id, content_key FROM batch_requests WHERE batch_id = ?", (batch_id,)
        ).fetchall()
        return dict(rows)


def _claim(row: tuple[str, str, float, int]) -> ValidationClaim:
    batch_id, owner, heartbeat, attempts = row
    return ValidationClaim(batch_id=batch_id, owner=owner, heartbeat=heartbeat, attempts=attempts)
