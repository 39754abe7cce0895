"""Content-addressed files every host can read: landed snapshots and the Batch API's files.

Embedded (SQLite state), a store's folder under the state dir holds its blobs, as it always did.
With KIMI_BATCH_DATABASE_URL, each blob is also kept in its store's schema in PostgreSQL, and the
folder is this host's read cache: a run on another machine fetches the snapshot it answers, and
the Batch API serves an output file a run wrote elsewhere, with no volume shared between them.

    blob_parts   (name, part) -> 1 MiB of the bytes
    blobs        name -> size, parts: written after the last part, so a blob without its row
                 (an upload killed midway) is never read; the next upload of it completes it

A blob's name starts with the sha256 of its bytes (`<sha256>` or `<sha256>.<ext>`; any other
name is refused, so none leads out of the folder): a fetched copy is checked against it before it
is renamed into the cache, and a cached file can never be stale. Parts are read one at a time,
so memory stays at one part whatever the file's size.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.paths import PRIVATE_FILE_MODE, StateLocation
from kimi_batch.state import StateDatabase
from kimi_batch.storage.exceptions import StorageError
from kimi_batch.storage.private_files import remove_stale_temps, temp_name

PART_BYTES = 1 << 20
# `<sha256>` or `<sha256>.<ext>`: a name is a file of the store's folder, never a path out of it
# (`../x`, `/abs`) nor one the OS would cut at a NUL.
_NAME = re.compile(r"[0-9a-f]{64}(?:\.[^/\x00]+)?")
_SCHEMA = (
    """
    CREATE TABLE IF NOT EXISTS blob_parts (
        name  TEXT NOT NULL,
        part  {int} NOT NULL,
        data  {blob} NOT NULL,
        PRIMARY KEY (name, part)
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS blobs (
        name   TEXT PRIMARY KEY,
        size   {int} NOT NULL,
        parts  {int} NOT NULL
    )
    """,
)


class SharedBlobs(BaseModel):
    """What `BlobStore.share_many` did (a migration's report)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    shared: int = Field(ge=0, description="Blobs put into the database now.")
    missing: list[str] = Field(description="Blobs named by a record but not on this host.")


class BlobStore:
    """The blobs of one store: its `folder`, and its database when that is shared by hosts."""

    def __init__(self, db: StateDatabase, folder: Path, location: StateLocation) -> None:
        self._db, self.folder = db, folder
        self.shared = not location.embedded
        if self.shared:
            db.create(_SCHEMA)

    def path(self, name: str) -> Path:
        """Where this host keeps the blob (it may not be here yet: `local`); StorageError for a
        name that is not a blob's."""
        return self.folder / _checked(name)

    def share(self, name: str, source: Path | None = None) -> None:
        """Make the blob readable by every host: its parts, then its row (from `source`, else
        its own file). Nothing to do when embedded or when it is shared already. Inside the
        caller's transaction when there is one. Bytes that do not hash to the name are a
        StorageError and leave no row and no parts: shared, every host's fetch would refuse
        them, and the right bytes shared later would have found the name taken."""
        _checked(name)  # a row under a name no host could fetch, or a file from outside
        if not self.shared or self.has(name):
            return
        size, part, digest = 0, 0, hashlib.sha256()
        with (source or self.path(name)).open("rb") as reader:
            while chunk := reader.read(PART_BYTES):
                self._db.execute(
                    "INSERT INTO blob_parts (name, part, data) VALUES (?, ?, ?) "
                    "ON CONFLICT (name, part) DO NOTHING",
                    (name, part, chunk),
                )
                digest.update(chunk)
                size, part = size + len(chunk), part + 1
        if digest.hexdigest() != name.split(".")[0]:
            # Not the parts of a blob another host shared whole meanwhile (its row says so).
            self._db.execute(
                "DELETE FROM blob_parts WHERE name = ? "
                "AND NOT EXISTS (SELECT 1 FROM blobs WHERE blobs.name = ?)",
                (name, name),
            )
            raise StorageError(f"{name}: the bytes to share do not match its name")
        self._db.execute(
            "INSERT INTO blobs (name, size, parts) VALUES (?, ?, ?) ON CONFLICT (name) DO NOTHING",
            (name, size, part),
        )

    def share_many(self, names: Iterable[str]) -> SharedBlobs:
        """`share` each of `names` this host has and the database lacks (a migration)."""
        shared, missing = 0, list[str]()
        for name in sorted(set(names)):
            if not self.shared or self.has(name):
                continue
            if not self.path(name).is_file():
                missing.append(name)
                continue
            self.share(name)
            shared += 1
        return SharedBlobs(shared=shared, missing=missing)

    def has(self, name: str) -> bool:
        """Whether the blob is whole in the shared database."""
        row = self._db.execute("SELECT 1 FROM blobs WHERE name = ?", (name,)).fetchone()
        return row is not None

    def local(self, name: str) -> Path:
        """The blob's file on this host, fetched from the shared database when it is not here."""
        path = self.path(name)
        if not self.shared or path.exists():
            return path
        row = self._db.execute("SELECT size, parts FROM blobs WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise StorageError(f"{name} is neither in {self.folder} nor in the state database")
        size, parts = int(row[0]), int(row[1])
        remove_stale_temps(self.folder)
        temp = temp_name(self.folder, "fetch")
        digest, fetched = hashlib.sha256(), 0
        try:
            with temp.open("wb") as writer:
                os.chmod(temp, PRIVATE_FILE_MODE)
                for part in range(parts):
                    (data,) = self._db.execute(
                        "SELECT data FROM blob_parts WHERE name = ? AND part = ?", (name, part)
                    ).fetchone() or (None,)
                    if data is None:
                        raise StorageError(f"{name}: part {part} of {parts} is missing")
                    digest.update(data)
                    fetched += writer.write(data)
                writer.flush()
                os.fsync(writer.fileno())
            if fetched != size or digest.hexdigest() != name.split(".")[0]:
                raise StorageError(f"{name}: the bytes fetched do not match its name")
            os.replace(temp, path)
        finally:
            temp.unlink(missing_ok=True)
        return path

    def forget(self, name: str) -> None:
        """Remove the blob from the shared database (the caller removes its own file)."""
        if self.shared:
            self._db.execute("DELETE FROM blobs WHERE name = ?", (name,))
            self._db.execute("DELETE FROM blob_parts WHERE name = ?", (name,))


def _checked(name: str) -> str:
    """`name` if it is a blob's name (`<sha256>` or `<sha256>.<ext>`), else StorageError."""
    if _NAME.fullmatch(name) is None:
        raise StorageError(f"{name!r} is not a blob name (<sha256> or <sha256>.<ext>)")
    return name
