"""Landed inputs: every inbox file snapshotted at ingestion, and its partition fixed at first sight.

    landed/<sha256>.<ext>       the bytes of one version of an input file (content-addressed)
    landed/manifest.sqlite3     name -> (ds, source) fixed when first seen; versions landed per partition

Once a file is landed, its partition never depends on the inbox again: removing, renaming or
rewriting the inbox file changes nothing already landed, and every downstream step reads the
snapshot. A file's partition is assigned the first time anything sees its name (the sensor, the
schedule, the demo) and never changes: a rewritten file is a new *version* of the same partition,
a new file never renames an old one's source, and an undated file's date is the day it arrived
(in the configured timezone), not its mtime, so `cp -p` / `rsync -a` copies are not lost in the
past and appending to a file on a later day does not split it into two partitions.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sqlite3
import time
import uuid
from datetime import date
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.paths import PRIVATE_FILE_MODE, StatePaths, connect_private_db, private_dir
from kimi_batch.settings import Settings
from kimi_batch.storage.exceptions import StorageError
from kimi_batch.storage.inbox import (
    InboxFile,
    NotRegularFileError,
    inspect_inbox_file,
    open_regular,
    sanitize_source,
    scan_inbox,
    short_hash,
)

__all__ = [
    "SETTLE_S",
    "Assignment",
    "InputNotSettledError",
    "InputTooLargeError",
    "LandedVersion",
    "Landing",
    "LandingIOError",
    "ResolvedInput",
    "landed_versions",
    "resolve_input",
    "resolve_partition",
    "still_changing",
    "wait_until_settled",
]

_log = logging.getLogger(__name__)

# A file whose size or mtime changed this recently may still be being written (a copy in
# progress): landing waits for it rather than snapshot half of it. The sensor uses the same.
SETTLE_S = 5.0

_COPY_CHUNK = 1 << 20
_SCHEMA = (
    """
    CREATE TABLE IF NOT EXISTS files (
        name       TEXT PRIMARY KEY,
        ds         TEXT NOT NULL,
        source     TEXT NOT NULL,
        first_seen REAL NOT NULL,
        dated_ds   TEXT,
        refused    TEXT,
        UNIQUE (ds, source)
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS versions (
        id        INTEGER PRIMARY KEY AUTOINCREMENT,
        ds        TEXT NOT NULL,
        source    TEXT NOT NULL,
        name      TEXT NOT NULL,
        sha256    TEXT NOT NULL,
        ext       TEXT NOT NULL,
        size      INTEGER NOT NULL,
        landed_at REAL NOT NULL
    )
    """,
    "CREATE INDEX IF NOT EXISTS versions_partition ON versions (ds, source, id)",
)


class InputTooLargeError(StorageError):
    """An input file is over the configured size limit; it is refused before it is read."""


class InputNotSettledError(StorageError):
    """The inbox file changed within the settle period, or while it was copied: not landed."""


class LandingIOError(StorageError):
    """The inbox file could not be copied for a reason of the machine, not of its content (disk
    full, I/O error, permission): nothing is landed, and the step fails so that it is tried
    again, rather than the partition being emptied for good."""


def still_changing(size_mtime: tuple[int, int], now_ns: int, settle_s: float = SETTLE_S) -> bool:
    """True when a file of (size, mtime_ns) may still be being written: modified within the last
    `settle_s` seconds (or dated in the future, where the mtime says nothing)."""
    age_s = (now_ns - size_mtime[1]) / 1e9
    return age_s < 0 or age_s < settle_s


def wait_until_settled(path: Path, size_mtime: tuple[int, int], settle_s: float = SETTLE_S) -> bool:
    """True once the file's (size, mtime) has stood still for `settle_s`, waiting at most that
    long; False when it changed meanwhile (a copy still in progress) or vanished."""
    if not still_changing(size_mtime, time.time_ns(), settle_s):
        return True
    age_s = (time.time_ns() - size_mtime[1]) / 1e9
    time.sleep(settle_s - age_s if 0 <= age_s < settle_s else settle_s)
    try:
        return _size_mtime(os.stat(path)) == size_mtime
    except FileNotFoundError:
        return False


class Assignment(BaseModel):
    """The partition an inbox name belongs to, fixed when the name was first seen."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    ds: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}$")
    source: str = Field(pattern=r"^[a-z0-9_]+$")
    first_seen: float
    dated_ds: str | None = Field(description="The dated inbox folder, when there was one.")
    refused: str | None = Field(description="Why the file was refused unread, when it was.")

    @property
    def clamped(self) -> bool:
        """True when a dated folder older than the partitions was moved to their first day."""
        return self.dated_ds is not None and self.dated_ds != self.ds


class LandedVersion(BaseModel):
    """One landed version of a partition's input."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ds: str
    source: str
    name: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    ext: str
    size: int = Field(ge=0)
    landed_at: float
    path: Path


class Landing:
    """The manifest and snapshots under `StatePaths.landed_dir`."""

    def __init__(self, paths: StatePaths) -> None:
        self.dir = private_dir(paths.landed_dir)
        self._db = connect_private_db(paths.manifest_path)
        for statement in _SCHEMA:
            self._db.execute(statement)

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Landing:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- partitions -----------------------------------------------------------------------

    def assignment(self, name: str) -> Assignment | None:
        row = self._db.execute(
            "SELECT name, ds, source, first_seen, dated_ds, refused FROM files WHERE name = ?",
            (name,),
        ).fetchone()
        return _assignment(row) if row else None

    def assignment_for(self, ds: str, source: str) -> Assignment | None:
        row = self._db.execute(
            "SELECT name, ds, source, first_seen, dated_ds, refused FROM files "
            "WHERE ds = ? AND source = ?",
            (ds, source),
        ).fetchone()
        return _assignment(row) if row else None

    def assignments(self) -> list[Assignment]:
        """Every partition ever assigned, oldest date first."""
        rows = self._db.execute(
            "SELECT name, ds, source, first_seen, dated_ds, refused FROM files ORDER BY ds, source"
        ).fetchall()
        return [_assignment(row) for row in rows]

    def assign(
        self,
        name: str,
        *,
        arrived: date,
        start: date,
        dated_ds: str | None = None,
        refused: str | None = None,
    ) -> Assignment:
        """The partition of `name`: the recorded one, else a new one recorded now.

        ds is the dated folder's date, else the arrival date; a date before the partitions'
        `start` moves to `start` (nothing is ever dropped for being early). The source is the
        sanitized file stem, told apart from other names of the same day by the extension,
        then a short hash: an existing assignment is never changed.
        """
        self._db.execute("BEGIN IMMEDIATE")
        try:
            existing = self.assignment(name)
            if existing is not None:
                if existing.refused != refused:
                    self._db.execute("UPDATE files SET refused = ? WHERE name = ?", (refused, name))
                    existing = existing.model_copy(update={"refused": refused})
                self._db.execute("COMMIT")
                return existing
            ds = max(date.fromisoformat(dated_ds), start) if dated_ds else max(arrived, start)
            source = self._free_source(ds.isoformat(), name)
            self._db.execute(
                "INSERT INTO files (name, ds, source, first_seen, dated_ds, refused) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (name, ds.isoformat(), source, time.time(), dated_ds, refused),
            )
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        assigned = self.assignment(name)
        assert assigned is not None
        return assigned

    def assign_file(self, item: InboxFile, *, arrived: date, start: date) -> Assignment:
        """`assign` for a scanned inbox file."""
        return self.assign(
            item.name, arrived=arrived, start=start, dated_ds=item.dated_ds, refused=item.refused
        )

    def assign_inbox(self, inbox_dir: Path, *, arrived: date, start: date) -> list[Assignment]:
        """Assign every inbox file (files seen before keep their partition)."""
        return [
            self.assign_file(item, arrived=arrived, start=start) for item in scan_inbox(inbox_dir)
        ]

    def _free_source(self, ds: str, name: str) -> str:
        path = Path(name)
        stem = sanitize_source(path.stem)
        for candidate in (
            stem,
            sanitize_source(f"{path.stem}_{path.suffix.lstrip('.')}"),
            sanitize_source(f"{stem}_{short_hash(name)}"),
        ):
            taken = self._db.execute(
                "SELECT 1 FROM files WHERE ds = ? AND source = ?", (ds, candidate)
            ).fetchone()
            if not taken:
                return candidate
        raise StorageError(f"no free source name for {name!r} on {ds}")

    # ---- versions ---------------------------------------------------------------------------

    def land(
        self,
        path: Path,
        assignment: Assignment,
        *,
        max_bytes: int,
        ext: str | None = None,
        settle_s: float = SETTLE_S,
    ) -> LandedVersion:
        """Snapshot `path` as the partition's newest version (hashing while copying).

        The size is checked before a byte is read and again while copying (a file growing
        during the copy is refused too). A file modified within the last `settle_s` is watched
        until its size and mtime have stood still that long; one that moves meanwhile, or while
        it is copied, raises InputNotSettledError and lands nothing. Only
        regular files are opened (NotRegularFileError: a FIFO never blocks). An OSError of the
        copy (disk full, I/O error) leaves no snapshot behind. The same content lands once and
        is not a new version.
        """
        ext = ext or path.suffix.lower().lstrip(".") or "bin"
        temp = self.dir / f".{uuid.uuid4().hex}.tmp"
        digest = hashlib.sha256()
        copied = 0
        try:
            with open_regular(path) as reader:
                before = _size_mtime(os.fstat(reader.fileno()))
                if before[0] > max_bytes:
                    raise InputTooLargeError(_too_large(before[0], max_bytes))
                if not wait_until_settled(path, before, settle_s):
                    raise InputNotSettledError(
                        f"{assignment.name} is still changing (its size or mtime moved within "
                        f"{settle_s:g} s); it lands once it has stopped changing"
                    )
                with temp.open("wb") as writer:
                    os.chmod(temp, PRIVATE_FILE_MODE)
                    while chunk := reader.read(_COPY_CHUNK):
                        copied += len(chunk)
                        if copied > max_bytes:
                            raise InputTooLargeError(_too_large(copied, max_bytes))
                        digest.update(chunk)
                        writer.write(chunk)
                    writer.flush()
                    os.fsync(writer.fileno())
                after = _size_mtime(os.stat(path))
                if after != before or copied != before[0]:
                    raise InputNotSettledError(
                        f"{assignment.name} is still changing (it went from {before[0]} to "
                        f"{after[0]} bytes while it was copied); it lands once it has stopped "
                        "changing"
                    )
            sha256 = digest.hexdigest()
            target = self.dir / f"{sha256}.{ext}"
            if not target.exists():
                os.replace(temp, target)
        finally:
            temp.unlink(missing_ok=True)
        current = self.current(assignment.ds, assignment.source)
        if current is not None and current.sha256 == sha256 and current.ext == ext:
            return current
        self._db.execute(
            "INSERT INTO versions (ds, source, name, sha256, ext, size, landed_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (assignment.ds, assignment.source, assignment.name, sha256, ext, copied, time.time()),
        )
        landed = self.current(assignment.ds, assignment.source)
        assert landed is not None
        return landed

    def has_version(self, ds: str, source: str, sha256: str) -> bool:
        """Whether this content was ever landed for the partition."""
        row = self._db.execute(
            "SELECT 1 FROM versions WHERE ds = ? AND source = ? AND sha256 = ? LIMIT 1",
            (ds, source, sha256),
        ).fetchone()
        return row is not None

    def current(self, ds: str, source: str) -> LandedVersion | None:
        """The newest landed version of a partition, None if nothing landed yet."""
        row = self._db.execute(
            "SELECT ds, source, name, sha256, ext, size, landed_at FROM versions "
            "WHERE ds = ? AND source = ? ORDER BY id DESC LIMIT 1",
            (ds, source),
        ).fetchone()
        if row is None:
            return None
        ds, source, name, sha256, ext, size, landed_at = row
        return LandedVersion(
            ds=ds,
            source=source,
            name=name,
            sha256=sha256,
            ext=ext,
            size=size,
            landed_at=landed_at,
            path=self.dir / f"{sha256}.{ext}",
        )


def landed_versions(paths: StatePaths) -> list[tuple[Assignment, str | None]]:
    """Every assignment with the sha256 of its newest landed version, read-only (for `status`).

    Nothing is created: no manifest yet is an empty list. An unreadable manifest (corrupted,
    not a database) raises StorageError naming it.
    """
    path = paths.manifest_path
    if not path.is_file():
        return []
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
        try:
            rows = db.execute(
                "SELECT f.name, f.ds, f.source, f.first_seen, f.dated_ds, f.refused, "
                "(SELECT v.sha256 FROM versions v WHERE v.ds = f.ds AND v.source = f.source "
                "ORDER BY v.id DESC LIMIT 1) FROM files f ORDER BY f.ds, f.source"
            ).fetchall()
        finally:
            db.close()
    except sqlite3.Error as error:
        raise StorageError(f"landing manifest {path} is unreadable: {error}") from error
    return [(_assignment(row[:6]), row[6]) for row in rows]


def _assignment(row: tuple[str, str, str, float, str | None, str | None]) -> Assignment:
    name, ds, source, first_seen, dated_ds, refused = row
    return Assignment(
        name=name, ds=ds, source=source, first_seen=first_seen, dated_ds=dated_ds, refused=refused
    )


def _size_mtime(status: os.stat_result) -> tuple[int, int]:
    return status.st_size, status.st_mtime_ns


def _too_large(size: int, limit: int) -> str:
    return (
        f"file is {size / 2**20:.1f} MiB, over the {limit / 2**20:.0f} MiB limit "
        "(KIMI_BATCH_MAX_INPUT_MB); split it or raise the limit"
    )


class ResolvedInput(BaseModel):
    """What a partition reads: its newest landed version, and why anything was refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    assignment: Assignment
    version: LandedVersion | None = Field(description="None: nothing could ever be landed.")
    problem: str | None = Field(
        default=None, description="Why the inbox file was not landed now (quarantine reason)."
    )
    deferred: str | None = Field(
        default=None,
        description="Why the inbox file's new content waits for a later run (still changing); "
        "the partition reads its newest landed version meanwhile.",
    )
    from_inbox: bool = Field(description="The inbox file was there and is this version.")


def resolve_input(
    landing: Landing,
    inbox_dir: Path,
    ds: str,
    source: str,
    *,
    max_bytes: int,
    arrived: date,
    start: date,
    settle_s: float = SETTLE_S,
) -> ResolvedInput:
    """Land the partition's inbox file if it is there (a new version if it changed), else fall
    back to the newest landed snapshot: a partition never depends on the inbox after ingestion.

    Inbox files nothing has seen yet are assigned first (arriving on `arrived`), so a partition
    materialized by hand finds its file. Only what is wrong with the file itself (refused, too
    large, not a regular file) is a `problem` for the quarantine. A file still being written is
    skipped with a log line (`deferred`) and read again by a later run; with no earlier version
    that raises InputNotSettledError. An I/O error of the machine raises LandingIOError and lands
    nothing. Raises StorageError for a partition with no input.
    """
    if landing.assignment_for(ds, source) is None:
        landing.assign_inbox(inbox_dir, arrived=arrived, start=start)
    assignment = landing.assignment_for(ds, source)
    if assignment is None:
        raise StorageError(
            f"no input file was ever seen for partition date={ds} source={source} "
            "(the sensor, the schedule or the demo assign inbox files to partitions)"
        )
    item = inspect_inbox_file(inbox_dir, assignment.name)
    problem = deferred = None
    if item is None:
        problem = assignment.refused
    elif item.refused is not None:
        problem = item.refused
    else:
        try:
            version = landing.land(item.path, assignment, max_bytes=max_bytes, settle_s=settle_s)
        except (InputTooLargeError, NotRegularFileError) as error:
            problem = f"cannot land {assignment.name}: {error}"
        except InputNotSettledError as error:
            if landing.current(ds, source) is None:
                raise
            deferred = str(error)
            _log.warning("%s; reading the last landed version meanwhile", error)
        except FileNotFoundError:
            problem = assignment.refused  # gone between the look and the copy: the snapshot
        except OSError as error:
            raise LandingIOError(
                f"cannot land {assignment.name} ({type(error).__name__}: {error}); nothing was "
                "landed, the step fails so that a retry or a later run lands it"
            ) from error
        else:
            return ResolvedInput(assignment=assignment, version=version, from_inbox=True)
    return ResolvedInput(
        assignment=assignment,
        version=landing.current(ds, source),
        problem=problem,
        deferred=deferred,
        from_inbox=False,
    )


def resolve_partition(settings: Settings, ds: str, source: str) -> ResolvedInput:
    """`resolve_input` for the deployment's state dir, limits and clock."""
    with Landing(settings.paths) as landing:
        return resolve_input(
            landing,
            settings.paths.inbox_dir,
            ds,
            source,
            max_bytes=settings.max_input_bytes,
            arrived=settings.today(),
            start=settings.first_partition_date(),
        )
