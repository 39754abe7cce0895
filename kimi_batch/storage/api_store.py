"""The Batch API's files and batches: what `kimi-batch api` and the API batch runs share.

    api/files/<sha256>   uploaded inputs and the output/error files (content-addressed, 0600)
    api/api.sqlite3      file ids -> blobs, batch records, each batch's request keys

A file id names one upload; two uploads of the same bytes share a blob, which is removed with
the last id naming it. A file is written to a temp name while its size is counted and refused
past the limit before it is kept. Batch records move only forward through the lifecycle
(`BatchStatus`); a transition is one transaction, so the API process and a Dagster run can both
update a batch.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import time
import uuid
from collections.abc import Iterable, Iterator
from enum import StrEnum
from pathlib import Path
from typing import IO, Any

from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.paths import PRIVATE_FILE_MODE, StatePaths, connect_private_db, private_dir
from kimi_batch.storage.exceptions import StorageError
from kimi_batch.tasks.openai_batch import BatchLineError

__all__ = [
    "TERMINAL_STATUSES",
    "ApiStore",
    "BatchRecord",
    "BatchStatus",
    "FileRecord",
    "FileTooLargeError",
]

_CHUNK = 1 << 20
_SCHEMA = (
    """
    CREATE TABLE IF NOT EXISTS files (
        seq        INTEGER PRIMARY KEY AUTOINCREMENT,
        id         TEXT NOT NULL UNIQUE,
        sha256     TEXT NOT NULL,
        record     TEXT NOT NULL
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS batches (
        seq        INTEGER PRIMARY KEY AUTOINCREMENT,
        id         TEXT NOT NULL UNIQUE,
        status     TEXT NOT NULL,
        record     TEXT NOT NULL
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


class FileTooLargeError(StorageError):
    """An upload is over the input limit; nothing of it is kept."""


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


class ApiStore:
    """Files and batches of the Batch API under `StatePaths.api_dir`."""

    def __init__(self, paths: StatePaths) -> None:
        private_dir(paths.api_dir)
        self.files_dir = private_dir(paths.api_files_dir)
        self._db = connect_private_db(paths.api_db_path)
        for statement in _SCHEMA:
            self._db.execute(statement)

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> ApiStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- files -------------------------------------------------------------------------------

    def blob_path(self, record: FileRecord) -> Path:
        return self.files_dir / record.sha256

    def add_file(
        self, reader: IO[bytes], *, filename: str, purpose: str, max_bytes: int
    ) -> FileRecord:
        """Copy `reader` in (hashing and counting); over `max_bytes` nothing is kept."""
        temp = self.files_dir / f".{uuid.uuid4().hex}.tmp"
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
            sha256 = digest.hexdigest()
            target = self.files_dir / sha256
            if not target.exists():
                os.replace(temp, target)
        finally:
            temp.unlink(missing_ok=True)
        record = FileRecord(
            id=f"file-{uuid.uuid4().hex[:24]}",
            bytes=size,
            created_at=int(time.time()),
            filename=filename,
            purpose=purpose,
            sha256=sha256,
        )
        self._db.execute(
            "INSERT INTO files (id, sha256, record) VALUES (?, ?, ?)",
            (record.id, sha256, record.model_dump_json()),
        )
        return record

    def add_lines(self, lines: Iterable[str], *, filename: str, purpose: str) -> FileRecord:
        """A generated file (batch output or errors) from its lines."""
        data = "".join(line + "\n" for line in lines).encode("utf-8")
        return self.add_file(
            io.BytesIO(data), filename=filename, purpose=purpose, max_bytes=len(data)
        )

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
        """Remove the id; the blob goes with the last id naming it."""
        record = self.file(file_id)
        if record is None:
            return False
        self._db.execute("DELETE FROM files WHERE id = ?", (file_id,))
        shared = self._db.execute(
            "SELECT 1 FROM files WHERE sha256 = ? LIMIT 1", (record.sha256,)
        ).fetchone()
        if not shared:
            self.blob_path(record).unlink(missing_ok=True)
        return True

    # ---- batches -----------------------------------------------------------------------------

    def add_batch(
        self,
        *,
        input_file_id: str,
        endpoint: str,
        completion_window_s: int,
        completion_window: str,
        metadata: dict[str, str] | None,
    ) -> BatchRecord:
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
        self._db.execute(
            "INSERT INTO batches (id, status, record) VALUES (?, ?, ?)",
            (record.id, record.status.value, record.model_dump_json()),
        )
        return record

    def batch(self, batch_id: str) -> BatchRecord | None:
        row = self._db.execute("SELECT record FROM batches WHERE id = ?", (batch_id,)).fetchone()
        return BatchRecord.model_validate_json(row[0]) if row else None

    def batches(
        self, *, after: str | None = None, limit: int = 10000, status: BatchStatus | None = None
    ) -> list[BatchRecord]:
        rows = self._page("batches", after=after, limit=limit, status=status)
        return [BatchRecord.model_validate_json(row[-1]) for row in rows]

    def update_batch(
        self, batch_id: str, *, status: BatchStatus | None = None, **fields: Any
    ) -> BatchRecord:
        """Set fields and, with `status`, enter it (stamping its time) unless the batch is
        already terminal: a finished batch never changes status again."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            row = self._db.execute(
                "SELECT record FROM batches WHERE id = ?", (batch_id,)
            ).fetchone()
            if row is None:
                raise StorageError(f"no batch {batch_id}")
            record = BatchRecord.model_validate_json(row[0])
            update = dict(fields)
            if status is not None and not record.terminal and status != record.status:
                update["status"] = status
                stamp = _STAMPS.get(status)
                if stamp is not None:
                    update[stamp] = int(time.time())
            record = BatchRecord.model_validate({**record.model_dump(), **update})
            self._db.execute(
                "UPDATE batches SET status = ?, record = ? WHERE id = ?",
                (record.status.value, record.model_dump_json(), batch_id),
            )
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        return record

    def set_request_keys(self, batch_id: str, keys: Iterable[tuple[str, str]]) -> None:
        """(custom_id, ledger content key) of every request of the batch, as planned."""
        self._db.executemany(
            "INSERT OR REPLACE INTO batch_requests (batch_id, custom_id, content_key) "
            "VALUES (?, ?, ?)",
            [(batch_id, custom_id, key) for custom_id, key in keys],
        )

    def request_keys(self, batch_id: str) -> dict[str, str]:
        rows = self._db.execute(
            "SELECT custom_id, content_key FROM batch_requests WHERE batch_id = ?", (batch_id,)
        ).fetchall()
        return dict(rows)

    def _page(
        self,
        table: str,
        *,
        after: str | None,
        limit: int,
        purpose: str | None = None,
        status: BatchStatus | None = None,
    ) -> Iterator[tuple[Any, ...]]:
        where, args = ["1 = 1"], list[Any]()
        if after is not None:
            where.append(f"seq < COALESCE((SELECT seq FROM {table} WHERE id = ?), -1)")
            args.append(after)
        if status is not None:
            where.append("status = ?")
            args.append(status.value)
        columns = "sha256, record" if table == "files" else "record"
        query = f"SELECT {columns} FROM {table} WHERE {' AND '.join(where)} ORDER BY seq DESC"
        for row in self._db.execute(query, args):
            if purpose is not None and json.loads(row[-1])["purpose"] != purpose:
                continue
            if limit <= 0:
                return
            limit -= 1
            yield row


def _file(row: tuple[str, str]) -> FileRecord:
    sha256, record = row
    return FileRecord.model_validate({**json.loads(record), "sha256": sha256})
