"""The Batch API's store: its files and its batches, shared by `kimi-batch api` and the runs.

    api/api.sqlite3      batch records, each batch's request keys, the files table; the
                         `kimi_api` schema of KIMI_BATCH_DATABASE_URL when it is set
    api/files/<sha256>   the files' bytes (0600 in a 0700 folder), shared by every id naming them

**Files**: uploads and generated files, content-addressed and owner-only. A file id names one
upload; two uploads of the same bytes share a blob, which is removed with the last id naming it.
An upload is staged (copied to a temp name while its size is counted and refused past the
limit), then kept: the blob is renamed into place and its id recorded in one write transaction.
A delete drops the id in one, and then, in another, unlinks its blob if no id names it any
more: killed in between, it leaves bytes no id names (removed when the API next starts), never
an id whose bytes are gone; a retried finish replacing an output file's record does the same. The store's write lock
(`StateDatabase.transaction`: SQLite's, or PostgreSQL's advisory lock) orders them, so a delete
racing an upload of the same bytes never removes the blob the upload's id names. The temps of a
writer killed mid-copy are removed by the next upload. A record whose bytes are nowhere (a
delete killed in the older order, its bytes unlinked before the commit) raises
`FileContentMissingError`, which the API answers 404, as for a file that does not exist. With
KIMI_BATCH_DATABASE_URL the blobs are kept in the `kimi_api` schema too (`storage.blobs`) and
`api/files/` is each host's cache: the API serves an output file a run wrote on another machine,
and a run reads an upload the API took. A blob is in the database before the id naming it is
committed, and leaves it with the last id naming it, in the same write transaction.

**Batches** move only forward through the lifecycle (`BatchStatus`, `NEXT_STATUSES`). Every
status change is a compare-and-set (`transition`): it happens only from the statuses the caller
expects and says whether it did, so a cancel landing between two steps of a run is never
overwritten by the run's next step. The API process and a Dagster run both update batches; each
change is one write transaction.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import socket
import time
import uuid
from collections.abc import Collection, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from enum import StrEnum
from pathlib import Path
from typing import IO, Any

from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.batch_api.lines import BatchLineError
from kimi_batch.crash_points import crash_point
from kimi_batch.llama import process_stat
from kimi_batch.paths import PRIVATE_FILE_MODE, StatePaths, private_dir
from kimi_batch.state import connect_state, read_state
from kimi_batch.storage import (
    BlobStore,
    SharedBlobs,
    StorageError,
    pid_alive,
    remove_stale_temps,
    temp_name,
)

_CHUNK = 1 << 20
_FILES_TABLE = """
    CREATE TABLE IF NOT EXISTS files (
        seq        {serial},
        id         TEXT NOT NULL UNIQUE,
        sha256     TEXT NOT NULL,
        record     TEXT NOT NULL
    )
"""


class FileTooLargeError(StorageError):
    """An upload is over the input limit; nothing of it is kept."""


class FileContentMissingError(StorageError):
    """A file's record whose bytes are nowhere, on this host or in the shared database (as a
    delete killed in the older order left one): the API answers it as a file that does not
    exist."""


# A blob's name in `files_dir`: its sha256 (temps start with a dot).
_BLOB_NAME = re.compile(r"[0-9a-f]{64}")


class FileRecord(BaseModel):
    """An uploaded or generated file, as the API shows it (OpenAI's file object)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    object: str = "file"
    bytes: int = Field(ge=0)
    created_at: int
    filename: str
    purpose: str
    status: str = "processed"
    sha256: str = Field(exclude=True)


class StagedFile(BaseModel):
    """An upload copied to its temp file, not yet kept (`ApiStore.keep_file`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    temp: Path
    sha256: str
    bytes: int = Field(ge=0)


class LineStaging:
    """A generated file written to its temp line by line, hashed and counted as it goes: a
    batch's output file is never held whole in memory (`ApiStore.stage_lines`)."""

    def __init__(self, folder: Path) -> None:
        self.temp = temp_name(folder, "lines")
        self._writer = self.temp.open("wb")
        os.chmod(self.temp, PRIVATE_FILE_MODE)
        self._digest = hashlib.sha256()
        self.bytes = 0
        self.lines = 0

    def write(self, line: str) -> None:
        data = (line + "\n").encode("utf-8")
        self._digest.update(data)
        self._writer.write(data)
        self.bytes += len(data)
        self.lines += 1

    def staged(self) -> StagedFile:
        """The file made durable and closed, ready for `ApiStore.keep_file`."""
        self._writer.flush()
        os.fsync(self._writer.fileno())
        self._writer.close()
        return StagedFile(temp=self.temp, sha256=self._digest.hexdigest(), bytes=self.bytes)

    def discard(self) -> None:
        self._writer.close()
        self.temp.unlink(missing_ok=True)


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
    # Whether any id still names a blob, asked on every delete (`_named`).
    "CREATE INDEX IF NOT EXISTS files_by_sha256 ON files (sha256)",
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


def process_token(pid: int | None = None) -> str:
    """Process `pid` (this one by default) as `<pid>.<start>`, its start in clock ticks after
    boot (/proc/PID/stat): one process, where a pid alone is reused by later ones. The bare pid
    where /proc cannot tell."""
    pid = os.getpid() if pid is None else pid
    stat = process_stat(pid)
    return f"{pid}.{stat.start_ticks}" if stat else str(pid)


def process_running(token: str) -> bool:
    """Whether the process a `process_token` names still runs on this host: not gone, not a
    zombie, not a later process given its pid."""
    pid, _, start = token.partition(".")
    if not pid.isdigit():
        return False
    if not start:
        return pid_alive(int(pid))
    stat = process_stat(int(pid))
    return stat is not None and not stat.exited and str(stat.start_ticks) == start


def process_owner() -> str:
    """This process, as a validation claim names it: `host:pid.start` (`process_token`: an API
    restarted under its predecessor's pid, as pid 1 in a container is, is another process)."""
    return f"{socket.gethostname()}:{process_token()}"


class ValidationClaim(BaseModel):
    """The process validating a batch (its creator from the start), its last sign of life and
    how many processes have started on it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    batch_id: str
    owner: str
    heartbeat: float
    attempts: int = Field(ge=0)

    def abandoned(self, now: float) -> bool:
        """Its owner is gone: no longer running on this host, else no beat for
        `VALIDATION_STALE_S`."""
        host, _, process = self.owner.rpartition(":")
        if host == socket.gethostname() and process[:1].isdigit():
            return not process_running(process)
        return now - self.heartbeat > VALIDATION_STALE_S


class ApiStore:
    """Files and batches of the Batch API under `StatePaths.api_dir`."""

    def __init__(self, paths: StatePaths) -> None:
        private_dir(paths.api_dir)
        self.files_dir = private_dir(paths.api_files_dir)
        self._db = connect_state(paths.api_state)
        self._db.create([_FILES_TABLE, *_SCHEMA])
        self._blobs = BlobStore(self._db, self.files_dir, paths.api_state)

    @staticmethod
    def exists(paths: StatePaths) -> bool:
        """Whether the store was ever created (read-only: creates nothing)."""
        db = read_state(paths.api_state)
        if db is not None:
            db.close()
        return db is not None

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> ApiStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def blob_path(self, record: FileRecord) -> Path:
        """The file's bytes on this host (fetched from the shared state database if need be);
        `FileContentMissingError` when they are nowhere."""
        try:
            path = self._blobs.local(record.sha256)
        except StorageError as error:
            raise FileContentMissingError(f"file {record.id}: {error}") from error
        if not path.is_file():
            raise FileContentMissingError(
                f"file {record.id}: its bytes are not in {self.files_dir}"
            )
        return path

    def share_all(self) -> SharedBlobs:
        """Put every file this host has into the shared state database (a migration)."""
        rows = self._db.execute("SELECT DISTINCT sha256 FROM files").fetchall()
        return self._blobs.share_many(row[0] for row in rows)

    def stage_file(self, reader: IO[bytes], *, max_bytes: int) -> StagedFile:
        """Copy `reader` to a temp file (hashing and counting); over `max_bytes` nothing is
        kept. The temps of writers killed mid-copy are removed first."""
        remove_stale_temps(self.files_dir)
        temp = temp_name(self.files_dir, "upload")
        digest = hashlib.sha256()
        size = 0
        try:
            with temp.open("wb") as writer:
                os.chmod(temp, PRIVATE_FILE_MODE)
                while chunk := reader.read(_CHUNK):
                    size += len(chunk)
                    if size > max_bytes:
                        raise FileTooLargeError(
                            f"file is over the input limit of {max_bytes} bytes "
                            "(KIMI_BATCH_MAX_INPUT_MB)"
                        )
                    digest.update(chunk)
                    writer.write(chunk)
                writer.flush()
                os.fsync(writer.fileno())
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        return StagedFile(temp=temp, sha256=digest.hexdigest(), bytes=size)

    def keep_file(
        self, staged: StagedFile, *, filename: str, purpose: str, file_id: str | None = None
    ) -> FileRecord:
        """Put a staged file in place and record its id, in one write transaction. A given
        `file_id` (a batch's output, derived from the batch) replaces the record a stopped
        write left under it, so a retried finish leaves one file, not two."""
        record = FileRecord(
            id=file_id or f"file-{uuid.uuid4().hex[:24]}",
            bytes=staged.bytes,
            created_at=int(time.time()),
            filename=filename,
            purpose=purpose,
            sha256=staged.sha256,
        )
        replaced = None
        try:
            self._blobs.share(staged.sha256, staged.temp)  # the long upload, before the lock
            with self._write_lock():
                # Always renamed over the blob (same bytes), and shared again if a delete took it
                # out meanwhile: whatever a delete did before this lock was taken, the blob
                # exists when the id is committed.
                os.replace(staged.temp, self.files_dir / staged.sha256)
                self._blobs.share(staged.sha256)
                replaced = self._db.execute(
                    "SELECT sha256 FROM files WHERE id = ?", (record.id,)
                ).fetchone()
                self._db.execute("DELETE FROM files WHERE id = ?", (record.id,))
                self._db.execute(
                    "INSERT INTO files (id, sha256, record) VALUES (?, ?, ?)",
                    (record.id, staged.sha256, record.model_dump_json()),
                )
                if replaced is not None:
                    self._forget_if_unnamed(replaced[0])
            if replaced is not None:
                # The replaced record's bytes go only once the new record is committed (see
                # `delete_file`).
                self._remove_if_unnamed(replaced[0])
            crash_point("api.file_kept")
        finally:
            staged.temp.unlink(missing_ok=True)
        return record

    def add_file(
        self, reader: IO[bytes], *, filename: str, purpose: str, max_bytes: int
    ) -> FileRecord:
        """Copy `reader` in (hashing and counting); over `max_bytes` nothing is kept."""
        staged = self.stage_file(reader, max_bytes=max_bytes)
        return self.keep_file(staged, filename=filename, purpose=purpose)

    @contextmanager
    def stage_lines(self) -> Iterator[LineStaging]:
        """A temp file to write a generated file into line by line; removed unless kept
        (`keep_lines`) by the end of the block."""
        remove_stale_temps(self.files_dir)
        staging = LineStaging(self.files_dir)
        try:
            yield staging
        finally:
            staging.discard()

    def keep_lines(
        self, staging: LineStaging, *, filename: str, purpose: str, file_id: str | None = None
    ) -> FileRecord | None:
        """Keep what `staging` holds as a file (as `keep_file`); None (nothing kept) when it
        has no line."""
        staged = staging.staged()
        if not staging.lines:
            return None
        return self.keep_file(staged, filename=filename, purpose=purpose, file_id=file_id)

    def add_lines(self, lines: Iterable[str], *, filename: str, purpose: str) -> FileRecord:
        """A generated file (batch output or errors) from its lines, streamed to disk."""
        with self.stage_lines() as staging:
            for line in lines:
                staging.write(line)
            staged = staging.staged()
            return self.keep_file(staged, filename=filename, purpose=purpose)

    def file(self, file_id: str) -> FileRecord | None:
        row = self._db.execute(
            "SELECT sha256, record FROM files WHERE id = ?", (file_id,)
        ).fetchone()
        return _file(row) if row else None

    def files(
        self, *, purpose: str | None = None, after: str | None = None, limit: int = 10000
    ) -> list[FileRecord]:
        """Newest first, like OpenAI's list; `after` is the last id of the previous page."""
        return [
            _file(row) for row in self._page("files", after=after, limit=limit, purpose=purpose)
        ]

    def delete_file(self, file_id: str) -> bool:
        """Remove the id, then the bytes no id names any more.

        Two write transactions, in this order: a process killed between them leaves bytes no id
        names (harmless, removed when the API next starts: `remove_unnamed_blobs`), never an id
        whose bytes are gone (the blob unlinked in the first, the commit lost, would leave one).
        Each runs under the write lock, so an upload of the same bytes either names them
        before, and keeps them, or puts them back after."""
        with self._write_lock():
            row = self._db.execute("SELECT sha256 FROM files WHERE id = ?", (file_id,)).fetchone()
            if row is None:
                return False
            self._db.execute("DELETE FROM files WHERE id = ?", (file_id,))
            self._forget_if_unnamed(row[0])
        self._remove_if_unnamed(row[0])
        crash_point("api.file_deleted")
        return True

    def _forget_if_unnamed(self, sha256: str) -> None:
        """The shared database's copy of the blob goes with the last id naming it, in the same
        transaction (under the write lock)."""
        if not self._named(sha256):
            self._blobs.forget(sha256)

    def _remove_if_unnamed(self, sha256: str) -> None:
        """Unlink this host's blob `sha256` if no id names it (one indexed lookup: a delete
        costs the same however many files are kept). Under the write lock, so no upload can
        name the bytes in between."""
        with self._write_lock():
            if not self._named(sha256):
                (self.files_dir / sha256).unlink(missing_ok=True)

    def remove_unnamed_blobs(self) -> int:
        """Unlink every blob of this host no id names, what a killed process left (a delete
        stopped after its commit, an upload before): run when the API starts. How many."""
        with self._write_lock():
            named = {row[0] for row in self._db.execute("SELECT DISTINCT sha256 FROM files")}
            unnamed = [
                path
                for path in self.files_dir.iterdir()
                if _BLOB_NAME.fullmatch(path.name) and path.name not in named
            ]
            for path in unnamed:
                path.unlink(missing_ok=True)
        return len(unnamed)

    def _named(self, sha256: str) -> bool:
        return (
            self._db.execute("SELECT 1 FROM files WHERE sha256 = ? LIMIT 1", (sha256,)).fetchone()
            is not None
        )

    def _write_lock(self) -> AbstractContextManager[None]:
        return self._db.transaction()

    def _page(
        self,
        table: str,
        *,
        after: str | None,
        limit: int,
        purpose: str | None = None,
        status: str | None = None,
    ) -> Iterator[tuple[Any, ...]]:
        where, args = ["1 = 1"], list[Any]()
        if after is not None:
            where.append(f"seq < COALESCE((SELECT seq FROM {table} WHERE id = ?), -1)")
            args.append(after)
        if status is not None:
            where.append("status = ?")
            args.append(status)
        columns = "sha256, record" if table == "files" else "record"
        query = f"SELECT {columns} FROM {table} WHERE {' AND '.join(where)} ORDER BY seq DESC"
        for row in self._db.execute(query, args):
            if purpose is not None and json.loads(row[-1])["purpose"] != purpose:
                continue
            if limit <= 0:
                return
            limit -= 1
            yield row

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


def _file(row: tuple[str, str]) -> FileRecord:
    sha256, record = row
    return FileRecord.model_validate({**json.loads(record), "sha256": sha256})
