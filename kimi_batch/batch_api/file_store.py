"""The Batch API's file store: uploads and generated files, content-addressed and owner-only.

    api/files/<sha256>   the bytes (0600 in a 0700 folder), shared by every id naming them
    files table          file id -> sha256 and its OpenAI file object

A file id names one upload; two uploads of the same bytes share a blob, which is removed with
the last id naming it. An upload is staged (copied to a temp name while its size is counted and
refused past the limit), then kept: the blob is renamed into place and its id recorded in one
write transaction. A delete drops the id and, when no other id names the blob, unlinks it in one
too. The store's write lock (`StateDatabase.transaction`: SQLite's, or PostgreSQL's advisory lock)
orders the two, so a delete racing an upload of the same bytes never removes the blob the
upload's id names. The temps of a writer killed mid-copy are removed by the next upload.

With KIMI_BATCH_DATABASE_URL the blobs are kept in the `kimi_api` schema too (`storage.blobs`)
and `api/files/` is each host's cache: the API serves an output file a run wrote on another
machine, and a run reads an upload the API took. A blob is in the database before the id naming
it is committed, and leaves it with the last id naming it, in the same write transaction.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import IO, Any

from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.crash_points import crash_point
from kimi_batch.paths import PRIVATE_FILE_MODE, StatePaths, private_dir
from kimi_batch.state import connect_state, read_state
from kimi_batch.storage import BlobStore, SharedBlobs, StorageError, remove_stale_temps, temp_name

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
    """An upload copied to its temp file, not yet kept (`ApiFileStore.keep_file`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    temp: Path
    sha256: str
    bytes: int = Field(ge=0)


class LineStaging:
    """A generated file written to its temp line by line, hashed and counted as it goes: a
    batch's output file is never held whole in memory (`ApiFileStore.stage_lines`)."""

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
        """The file made durable and closed, ready for `ApiFileStore.keep_file`."""
        self._writer.flush()
        os.fsync(self._writer.fileno())
        self._writer.close()
        return StagedFile(temp=self.temp, sha256=self._digest.hexdigest(), bytes=self.bytes)

    def discard(self) -> None:
        self._writer.close()
        self.temp.unlink(missing_ok=True)


class ApiFileStore:
    """The files of the Batch API under `StatePaths.api_dir` (the batches: `ApiStore`)."""

    def __init__(self, paths: StatePaths) -> None:
        private_dir(paths.api_dir)
        self.files_dir = private_dir(paths.api_files_dir)
        self._db = connect_state(paths.api_state)
        self._db.create([_FILES_TABLE])
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

    def __exit__(self, *exc: object) -> None:
        self.close()

    def blob_path(self, record: FileRecord) -> Path:
        """The file's bytes on this host (fetched from the shared state database if need be)."""
        return self._blobs.local(record.sha256)

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
                    self._drop_blob_if_unnamed(replaced[0])
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
        """Remove the id; the blob goes with the last id naming it (under the write lock, so an
        upload of the same bytes either names it before, and keeps it, or puts it back)."""
        with self._write_lock():
            row = self._db.execute("SELECT sha256 FROM files WHERE id = ?", (file_id,)).fetchone()
            if row is None:
                return False
            self._db.execute("DELETE FROM files WHERE id = ?", (file_id,))
            self._drop_blob_if_unnamed(row[0])
        crash_point("api.file_deleted")
        return True

    def _drop_blob_if_unnamed(self, sha256: str) -> None:
        """The blob goes when no id names it (called under the write lock)."""
        shared = self._db.execute(
            "SELECT 1 FROM files WHERE sha256 = ? LIMIT 1", (sha256,)
        ).fetchone()
        if not shared:
            # Unlinked before the commit, still under the lock: no upload can record an id
            # for these bytes in between.
            (self.files_dir / sha256).unlink(missing_ok=True)
            self._blobs.forget(sha256)

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


def _file(row: tuple[str, str]) -> FileRecord:
    sha256, record = row
    return FileRecord.model_validate({**json.loads(record), "sha256": sha256})
