"""Landed inputs: every inbox file snapshotted at ingestion, and its partition fixed at first sight.
An inbox file is landed whole: once it has stopped changing (a copy in progress is never landed
half), one version of it is copied into `landed/`, hashed while it is copied, then recorded in
the manifest.

    landed/<sha256>.<ext>       the bytes of one version of an input file (content-addressed)
    landed/manifest.sqlite3     name -> (ds, source) fixed when first seen; versions landed per partition
                                (the `kimi_landing` schema of KIMI_BATCH_DATABASE_URL when it is set)

With KIMI_BATCH_DATABASE_URL the snapshots are kept in that schema too (`storage.blobs`), and
`landed/` is each host's cache of them: a run on any machine reads the version it answers
(`readable`), whichever machine landed it.

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
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import date
from pathlib import Path
from typing import Any, BinaryIO

from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.crash_points import crash_point
from kimi_batch.inputs.inbox import InboxFile, sanitize_source, scan_inbox, short_hash
from kimi_batch.paths import PRIVATE_FILE_MODE, StatePaths, private_dir
from kimi_batch.state import StateError, connect_state, read_state
from kimi_batch.storage import (
    BlobStore,
    SharedBlobs,
    StorageError,
    open_regular,
    remove_stale_temps,
    temp_name,
)

# ---- whether a file has settled -----------------------------------------------------------------


# A file whose size or mtime changed this recently may still be being written (a copy in
# progress): landing waits for it rather than snapshot half of it. The sensor uses the same.
SETTLE_S = 5.0


class InputNotSettledError(StorageError):
    """The inbox file changed within the settle period, or while it was copied: not landed."""


def still_changing(size_mtime: tuple[int, int], now_ns: int, settle_s: float = SETTLE_S) -> bool:
    """True when a file of (size, mtime_ns) may still be being written: modified within the last
    `settle_s` seconds (or dated in the future, where the mtime says nothing)."""
    age_s = (now_ns - size_mtime[1]) / 1e9
    return age_s < 0 or age_s < settle_s


def wait_until_settled(
    path: Path | int, size_mtime: tuple[int, int], settle_s: float = SETTLE_S
) -> bool:
    """True once the file's (size, mtime) has stood still for `settle_s`, waiting at most that
    long; False when it changed meanwhile (a copy still in progress) or vanished. `path` may be
    an open descriptor (what is being copied, whatever the name now leads to)."""
    if not still_changing(size_mtime, time.time_ns(), settle_s):
        return True
    age_s = (time.time_ns() - size_mtime[1]) / 1e9
    time.sleep(settle_s - age_s if 0 <= age_s < settle_s else settle_s)
    try:
        return size_mtime_of(os.stat(path)) == size_mtime
    except FileNotFoundError:
        return False


def size_mtime_of(status: os.stat_result) -> tuple[int, int]:
    """What `still_changing` compares: (size, mtime_ns)."""
    return status.st_size, status.st_mtime_ns


# ---- the snapshot copy --------------------------------------------------------------------------


_COPY_CHUNK = 1 << 20


class InputTooLargeError(StorageError):
    """An input file is over the configured size limit; it is refused before it is read."""


class Snapshot(BaseModel):
    """A content-addressed copy: `<landed_dir>/<sha256>.<ext>`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    ext: str
    size: int = Field(ge=0)


def copy_snapshot(
    reader: BinaryIO,
    landed_dir: Path,
    *,
    name: str,
    max_bytes: int,
    ext: str,
    settle_s: float = SETTLE_S,
) -> Snapshot:
    """Copy the open file `reader` (inbox file `name`, from its start) to
    `landed_dir/<sha256>.<ext>`, fsynced, owner-only.

    Every look at the file is through the open descriptor (fstat, read): a name swapped after
    it was opened changes nothing here (`inbox.open_inbox_file` opened it without following a
    link out of the inbox). The size is checked before a byte is read and again while copying
    (a file growing during the copy is refused too). A file modified within the last `settle_s`
    is watched until its size and mtime have stood still that long; one that moves meanwhile,
    or whose size or mtime moves while it is copied, raises InputNotSettledError, as does one
    whose ctime moves unless its bytes, read once more, are the copy's (a chmod moves the ctime
    and not the bytes). An OSError of the copy (disk full, I/O error) leaves no file behind.
    """
    remove_stale_temps(landed_dir)  # those of a copy killed midway (named by pid)
    temp = temp_name(landed_dir, "snapshot")
    descriptor = reader.fileno()
    try:
        before_status = os.fstat(descriptor)
        before = size_mtime_of(before_status)
        if before[0] > max_bytes:
            raise InputTooLargeError(_too_large(before[0], max_bytes))
        if not wait_until_settled(descriptor, before, settle_s):
            raise InputNotSettledError(
                f"{name} is still changing (its size or mtime moved within "
                f"{settle_s:g} s); it lands once it has stopped changing"
            )
        copied, sha256 = _copy_counted(reader, temp, max_bytes)
        after_status = os.fstat(descriptor)
        after = size_mtime_of(after_status)
        if (
            after != before
            or copied != before[0]
            or not _ctime_kept_or_bytes_kept(descriptor, before_status, after_status, sha256)
        ):
            raise InputNotSettledError(
                f"{name} is still changing (its size, mtime or ctime moved while it was "
                f"copied: {before[0]} bytes, then {after[0]}); it lands once it has stopped "
                "changing"
            )
        target = landed_dir / f"{sha256}.{ext}"
        # Put in place even when a snapshot of that name is there: the same bytes, unless that
        # file was damaged since (every later run reads it, and no reader checks it against
        # its name; the copy just hashed is whole). The rename is atomic for its readers.
        first = not target.exists()
        os.replace(temp, target)
        if first:
            crash_point("landing.snapshot_copied")
    finally:
        temp.unlink(missing_ok=True)
    return Snapshot(sha256=sha256, ext=ext, size=copied)


def _copy_counted(reader: BinaryIO, temp: Path, max_bytes: int) -> tuple[int, str]:
    """`reader` copied to `temp` (owner-only, fsynced), refused past `max_bytes`: the bytes
    copied and their sha256."""
    digest = hashlib.sha256()
    copied = 0
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
    return copied, digest.hexdigest()


def _ctime_kept_or_bytes_kept(
    descriptor: int, before: os.stat_result, after: os.stat_result, sha256: str
) -> bool:
    """Whether the file's ctime stood still during the copy, or else its bytes, read once more
    from its start through the same descriptor, hash to the copy's `sha256`.

    The ctime is looked at because a writer that rewrites the file in place and puts its mtime
    back (`rsync --inplace -a`, `cp -p` onto it) leaves size and mtime as they were, and the copy
    would hold the start of one write and the rest of the other; no one can set the ctime back.
    But any chmod, chown, link, rename or xattr write moves it too, and a file under constant
    metadata churn (a backup agent) would be refused at every look. A copy mixing two writes
    never equals a re-read of the file once that writer is done; a writer still writing makes
    the two differ, and the file is refused as before."""
    if after.st_ctime_ns == before.st_ctime_ns:
        return True
    digest, offset = hashlib.sha256(), 0
    while offset <= after.st_size and (chunk := os.pread(descriptor, _COPY_CHUNK, offset)):
        digest.update(chunk)
        offset += len(chunk)
    return offset == after.st_size and digest.hexdigest() == sha256


def _too_large(size: int, limit: int) -> str:
    return (
        f"file is {size / 2**20:.1f} MiB, over the {limit / 2**20:.0f} MiB limit "
        "(KIMI_BATCH_MAX_INPUT_MB); split it or raise the limit"
    )


# ---- the manifest: partitions and versions ------------------------------------------------------


# (size, mtime_ns, inode, ctime_ns) of a file: a content rewritten in place changes the ctime
# at least, one renamed over it the inode.
FileStat = tuple[int, int, int, int]

_SCHEMA = (
    """
    CREATE TABLE IF NOT EXISTS files (
        name       TEXT PRIMARY KEY,
        ds         TEXT NOT NULL,
        source     TEXT NOT NULL,
        first_seen {real} NOT NULL,
        dated_ds   TEXT,
        refused    TEXT,
        UNIQUE (ds, source)
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS versions (
        id        {serial},
        ds        TEXT NOT NULL,
        source    TEXT NOT NULL,
        name      TEXT NOT NULL,
        sha256    TEXT NOT NULL,
        ext       TEXT NOT NULL,
        size      {int} NOT NULL,
        landed_at {real} NOT NULL
    )
    """,
    "CREATE INDEX IF NOT EXISTS versions_partition ON versions (ds, source, id)",
    # The version a partition's seeds and input quarantine were both written from: forgotten
    # before the first of the two writes, recorded after the second, so a run killed between
    # them lands the version again.
    """
    CREATE TABLE IF NOT EXISTS consumed (
        ds          TEXT NOT NULL,
        source      TEXT NOT NULL,
        sha256      TEXT NOT NULL,
        consumed_at {real} NOT NULL,
        PRIMARY KEY (ds, source)
    )
    """,
    # The stat of each inbox file when its content was last hashed (`fingerprint`), so a look
    # at the whole inbox reads only the files that changed since.
    """
    CREATE TABLE IF NOT EXISTS fingerprints (
        name      TEXT PRIMARY KEY,
        size      {int} NOT NULL,
        mtime_ns  {int} NOT NULL,
        inode     {int} NOT NULL,
        ctime_ns  {int} NOT NULL,
        sha256    TEXT NOT NULL
    )
    """,
)


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
        self._db = connect_state(paths.manifest_state)
        self._db.create(_SCHEMA)
        self._blobs = BlobStore(self._db, self.dir, paths.manifest_state)

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
        with self._db.transaction():  # one writer decides a new name's partition
            existing = self.assignment(name)
            if existing is not None:
                if existing.refused != refused:
                    self._db.execute("UPDATE files SET refused = ? WHERE name = ?", (refused, name))
                    existing = existing.model_copy(update={"refused": refused})
                return existing
            ds = max(date.fromisoformat(dated_ds), start) if dated_ds else max(arrived, start)
            source = self._free_source(ds.isoformat(), name)
            self._db.execute(
                "INSERT INTO files (name, ds, source, first_seen, dated_ds, refused) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (name, ds.isoformat(), source, time.time(), dated_ds, refused),
            )
        crash_point("landing.partition_assigned")
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
        source: Path | InboxFile,
        assignment: Assignment,
        *,
        max_bytes: int,
        ext: str | None = None,
        settle_s: float = SETTLE_S,
        handle: BinaryIO | None = None,
    ) -> LandedVersion:
        """Snapshot `source` as the partition's newest version (`copy_snapshot`: size limits,
        the settle wait, regular files only, nothing left behind by an OSError). An inbox
        file is opened by `InboxFile.open` (never through a link out of the inbox; InboxLinkError),
        a path (a Batch API blob the store wrote) as a regular file; `handle`, when given, is
        that file already open, read from its start. The same content lands once and is not a
        new version. With a shared state database the snapshot is in it before its version is
        recorded."""
        path = source.path if isinstance(source, InboxFile) else source
        ext = ext or path.suffix.lower().lstrip(".") or "bin"
        with _opened(source, handle) as reader:
            snapshot = copy_snapshot(
                reader,
                self.dir,
                name=assignment.name,
                max_bytes=max_bytes,
                ext=ext,
                settle_s=settle_s,
            )
        self._blobs.share(f"{snapshot.sha256}.{ext}")
        with self._db.transaction():  # two processes landing the same bytes add one version
            current = self.current(assignment.ds, assignment.source)
            if current is not None and current.sha256 == snapshot.sha256 and current.ext == ext:
                return current
            self._db.execute(
                "INSERT INTO versions (ds, source, name, sha256, ext, size, landed_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    assignment.ds,
                    assignment.source,
                    assignment.name,
                    snapshot.sha256,
                    ext,
                    snapshot.size,
                    time.time(),
                ),
            )
        crash_point("landing.version_recorded")
        landed = self.current(assignment.ds, assignment.source)
        assert landed is not None
        return landed

    def readable(self, version: LandedVersion | None) -> LandedVersion | None:
        """`version` with its snapshot on this host (fetched from the shared state database when
        another host landed it), ready to be read at `version.path`."""
        if version is not None:
            self._blobs.local(version.path.name)
        return version

    def share_all(self) -> SharedBlobs:
        """Put every landed snapshot this host has into the shared state database (a
        migration)."""
        versions = self._db.execute("SELECT DISTINCT sha256, ext FROM versions").fetchall()
        return self._blobs.share_many(f"{sha256}.{ext}" for sha256, ext in versions)

    def earlier_landings(self, ds: str, source: str, sha256: str) -> int:
        """How often this content was landed for the partition before its landing that is (or
        would be) the newest: 0 the first time, 1 for A in A -> B -> A, the same count again
        while A stays the newest. Versions are events in time: a run key made of the content
        and this count is new for every landing and stable while the content stays current."""
        (count,) = self._db.execute(
            "SELECT COUNT(*) FROM versions WHERE ds = ? AND source = ? AND sha256 = ?",
            (ds, source, sha256),
        ).fetchone()
        current = self.current(ds, source)
        return count - 1 if current is not None and current.sha256 == sha256 else count

    def record_consumed(self, ds: str, source: str, sha256: str) -> None:
        """The partition's seeds and input quarantine are now both written from `sha256`."""
        self._db.execute(
            "INSERT INTO consumed (ds, source, sha256, consumed_at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (ds, source) DO UPDATE SET sha256 = excluded.sha256, "
            "consumed_at = excluded.consumed_at",
            (ds, source, sha256, time.time()),
        )
        crash_point("landing.seeds_consumed")

    def forget_consumed(self, ds: str, source: str) -> None:
        """The partition's seeds are about to be written again: no version is consumed until
        `record_consumed` follows both writes. The record names a content, not a landing, so a
        record left in place would vouch for the old quarantine once the seeds are back at its
        content (V consumed, W's quarantine written, V's seeds written: both kills skipped)."""
        self._db.execute("DELETE FROM consumed WHERE ds = ? AND source = ?", (ds, source))

    def consumed(self, ds: str, source: str) -> str | None:
        """The version the partition's seeds and input quarantine were last both written from
        (None: never, or a landing that stopped between the two writes)."""
        row = self._db.execute(
            "SELECT sha256 FROM consumed WHERE ds = ? AND source = ?", (ds, source)
        ).fetchone()
        return None if row is None else str(row[0])

    def current(self, ds: str, source: str) -> LandedVersion | None:
        """The newest landed version of a partition, None if nothing landed yet."""
        row = self._db.execute(
            "SELECT ds, source, name, sha256, ext, size, landed_at FROM versions "
            "WHERE ds = ? AND source = ? ORDER BY id DESC LIMIT 1",
            (ds, source),
        ).fetchone()
        return None if row is None else self._landed(row)

    def version(self, ds: str, source: str, sha256: str) -> LandedVersion | None:
        """The partition's landed version of content `sha256` (an older one too), readable on
        this host; None when it was never landed here."""
        row = self._db.execute(
            "SELECT ds, source, name, sha256, ext, size, landed_at FROM versions "
            "WHERE ds = ? AND source = ? AND sha256 = ? ORDER BY id DESC LIMIT 1",
            (ds, source, sha256),
        ).fetchone()
        return None if row is None else self.readable(self._landed(row))

    def _landed(self, row: Sequence[Any]) -> LandedVersion:
        """A `versions` row (ds, source, name, sha256, ext, size, landed_at) as its version."""
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

    # ---- inbox fingerprints ------------------------------------------------------------------

    def fingerprint(self, name: str) -> tuple[FileStat, str] | None:
        """The stat of inbox file `name` when it was last hashed, and the sha256 it had."""
        row = self._db.execute(
            "SELECT size, mtime_ns, inode, ctime_ns, sha256 FROM fingerprints WHERE name = ?",
            (name,),
        ).fetchone()
        if row is None:
            return None
        size, mtime_ns, inode, ctime_ns, sha256 = row
        return (int(size), int(mtime_ns), int(inode), int(ctime_ns)), sha256

    def remember_fingerprint(self, name: str, stat: FileStat, sha256: str) -> None:
        """Inbox file `name` had content `sha256` while its stat was `stat`."""
        self._db.execute(
            "INSERT INTO fingerprints (name, size, mtime_ns, inode, ctime_ns, sha256) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET size = excluded.size, "
            "mtime_ns = excluded.mtime_ns, inode = excluded.inode, "
            "ctime_ns = excluded.ctime_ns, sha256 = excluded.sha256",
            (name, *stat, sha256),
        )
        crash_point("landing.fingerprint")


@contextmanager
def _opened(source: Path | InboxFile, handle: BinaryIO | None) -> Iterator[BinaryIO]:
    """`handle` rewound (its owner closes it), else `source` opened here and closed after."""
    if handle is not None:
        handle.seek(0)
        yield handle
        return
    with source.open() if isinstance(source, InboxFile) else open_regular(source) as reader:
        yield reader


def landed_versions(paths: StatePaths) -> list[tuple[Assignment, str | None]]:
    """Every assignment with the sha256 of its newest landed version, read-only (for `status`).

    Nothing is created: no manifest yet is an empty list. An unreadable manifest (corrupted,
    not a database, an unreachable server) raises StorageError naming it.
    """
    try:
        db = read_state(paths.manifest_state)
        if db is None:
            return []
        with db:
            rows = db.execute(
                "SELECT f.name, f.ds, f.source, f.first_seen, f.dated_ds, f.refused, "
                "(SELECT v.sha256 FROM versions v WHERE v.ds = f.ds AND v.source = f.source "
                "ORDER BY v.id DESC LIMIT 1) FROM files f ORDER BY f.ds, f.source"
            ).fetchall()
    except StateError as error:
        raise StorageError(f"landing manifest is unreadable: {error}") from error
    return [(_assignment(row[:6]), row[6]) for row in rows]


def _assignment(row: tuple[str, str, str, float, str | None, str | None]) -> Assignment:
    name, ds, source, first_seen, dated_ds, refused = row
    return Assignment(
        name=name, ds=ds, source=source, first_seen=first_seen, dated_ds=dated_ds, refused=refused
    )
