"""Which version of each partition an object-store warehouse reads: the pointer table.

An object store has no rename, so every write of a partition is a new version under a prefix of
its own (`<table>/ds=D/source=S/<version>/part-0.parquet`), and this table, in the ledger's store
beside the partition leases, names the current one. Switching it is one transaction: the same
one in which the writer's lease is confirmed (`Fence.fenced`), so a holder that lost its lease
switches nothing, and a reader sees the old version or the new one, whole.

A version that is no longer current, or whose writer never switched to it (killed mid-upload,
refused by its fence), is garbage: it is listed with the time after which it may be deleted
(a grace period for readers that looked the old pointer up just before the switch, and for
Trino queries planned on it), and the next write deletes what is due.

    warehouse_partitions  (table_name, ds, source) -> version, rows, bytes, switched_at
    warehouse_garbage     prefix -> due_at (wall-clock seconds)
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from kimi_batch.paths import StateLocation
from kimi_batch.state import StateDatabase, connect_state, read_state
from kimi_batch.storage.parquet import partition_prefix

__all__ = ["CurrentVersion", "PartitionVersions", "version_prefix"]

_SCHEMA = (
    """
    CREATE TABLE IF NOT EXISTS warehouse_partitions (
        table_name  TEXT NOT NULL,
        ds          TEXT NOT NULL,
        source      TEXT NOT NULL,
        version     TEXT NOT NULL,
        rows        {int} NOT NULL,
        bytes       {int} NOT NULL,
        switched_at {real} NOT NULL,
        PRIMARY KEY (table_name, ds, source)
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS warehouse_garbage (
        prefix TEXT PRIMARY KEY,
        due_at {real} NOT NULL
    )
    """,
)
_TABLES = ("warehouse_partitions", "warehouse_garbage")


def version_prefix(table: str, ds: str, source: str, version: str) -> str:
    """`<table>/ds=D/source=S/<version>`: where a version's file is, under the warehouse root."""
    return f"{partition_prefix(table, ds, source)}/{version}"


@dataclass(frozen=True, kw_only=True)
class CurrentVersion:
    """A partition's current version and its figures (counted when it was written)."""

    version: str
    rows: int
    bytes: int


class PartitionVersions:
    """The pointer table of an object-store warehouse, in the store `location` names."""

    def __init__(self, location: StateLocation) -> None:
        self.location = location

    def create(self) -> None:
        """The tables, if new (before the first write: `switch` runs inside another's
        transaction, where creating them would nest one)."""
        with connect_state(self.location) as db:
            db.create(_SCHEMA)

    def _reader(self) -> StateDatabase | None:
        """The store for reading, or None when no version was ever switched to (nothing is
        created by a reader: `status` and exports never make the ledger)."""
        db = read_state(self.location)
        if db is not None and not db.columns(_TABLES[0]):
            db.close()
            return None
        return db

    def current(self, table: str, ds: str, source: str) -> CurrentVersion | None:
        db = self._reader()
        if db is None:
            return None
        with db:
            row = db.execute(
                "SELECT version, rows, bytes FROM warehouse_partitions "
                "WHERE table_name = ? AND ds = ? AND source = ?",
                (table, ds, source),
            ).fetchone()
        if row is None:
            return None
        return CurrentVersion(version=str(row[0]), rows=int(row[1]), bytes=int(row[2]))

    def partitions(self, table: str) -> list[tuple[str, str]]:
        """(ds, source) of every partition of `table` that has a current version, sorted."""
        db = self._reader()
        if db is None:
            return []
        with db:
            rows = db.execute(
                "SELECT ds, source FROM warehouse_partitions WHERE table_name = ? "
                "ORDER BY ds, source",
                (table,),
            ).fetchall()
        return [(str(ds), str(source)) for ds, source in rows]

    def rows(self, table: str) -> int:
        db = self._reader()
        if db is None:
            return 0
        with db:
            row = db.execute(
                "SELECT COALESCE(SUM(rows), 0) FROM warehouse_partitions WHERE table_name = ?",
                (table,),
            ).fetchone()
        return int(row[0])

    def expect(self, prefix: str, *, within_s: float) -> None:
        """A version about to be uploaded: garbage unless switched to within `within_s` (its
        writer was killed mid-upload, or never came back)."""
        with connect_state(self.location) as db:
            _collect(db, prefix, time.time() + within_s)

    def switch(
        self,
        db: StateDatabase,
        partition: tuple[str, str, str],
        current: CurrentVersion,
        *,
        grace_s: float,
    ) -> str | None:
        """Make `current` the partition's version, inside `db`'s open transaction; the old
        version becomes garbage due in `grace_s`. Returns the old version's prefix."""
        table, ds, source = partition
        row = db.execute(
            "SELECT version FROM warehouse_partitions "
            "WHERE table_name = ? AND ds = ? AND source = ?",
            (table, ds, source),
        ).fetchone()
        db.execute(
            "INSERT INTO warehouse_partitions "
            "(table_name, ds, source, version, rows, bytes, switched_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (table_name, ds, source) DO UPDATE SET "
            "version = excluded.version, rows = excluded.rows, bytes = excluded.bytes, "
            "switched_at = excluded.switched_at",
            (table, ds, source, current.version, current.rows, current.bytes, time.time()),
        )
        db.execute(
            "DELETE FROM warehouse_garbage WHERE prefix = ?",
            (version_prefix(table, ds, source, current.version),),
        )
        if row is None or str(row[0]) == current.version:
            return None
        old = version_prefix(table, ds, source, str(row[0]))
        _collect(db, old, time.time() + grace_s)
        return old

    def due(self, *, limit: int = 100) -> list[str]:
        """Garbage prefixes whose time has come, oldest first."""
        with connect_state(self.location) as db:
            rows = db.execute(
                "SELECT prefix FROM warehouse_garbage WHERE due_at <= ? ORDER BY due_at LIMIT ?",
                (time.time(), limit),
            ).fetchall()
        return [str(prefix) for (prefix,) in rows]

    def forget(self, prefix: str) -> None:
        """A garbage prefix deleted from the store (or never uploaded)."""
        with connect_state(self.location) as db:
            db.execute("DELETE FROM warehouse_garbage WHERE prefix = ?", (prefix,))


def _collect(db: StateDatabase, prefix: str, due_at: float) -> None:
    db.execute(
        "INSERT INTO warehouse_garbage (prefix, due_at) VALUES (?, ?) "
        "ON CONFLICT (prefix) DO UPDATE SET due_at = excluded.due_at",
        (prefix, due_at),
    )
