"""Which version of each partition is current: the pointer table of a warehouse with no rename.

An object store cannot rename, so each write of a partition is a version under a prefix of its
own (`<table>/ds=D/source=S/<version>/part-0.parquet`), and this table, in the ledger's store
beside the partition leases, names the current one. The switch is made inside the writer's fence
(`Lease.fenced`): the transaction that confirms the lease commits the pointer, so a holder that
lost its lease switches nothing (even one that stalled after the confirmation: the commit itself
is the check), and a reader sees the old version or the new one, whole.

A version that is no longer current, or that its writer never switched to (killed mid-upload,
refused by its fence), is garbage: listed with the time after which it may be deleted (a grace
period for readers that looked up the old pointer just before the switch, and for Trino queries
planned on it).

    warehouse_partitions  (table_name, ds, source) -> version, row_count, byte_count, switched_at
    warehouse_garbage     prefix -> due_at (wall-clock seconds)
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date

from kimi_batch.paths import StateLocation
from kimi_batch.state import Fence, StateDatabase, connect_state, read_state
from kimi_batch.storage.parquet import validate_ds, validate_source
from kimi_batch.storage.schema import model_for

__all__ = ["CurrentVersion", "PartitionVersions", "version_prefix"]

_SCHEMA = (
    """
    CREATE TABLE IF NOT EXISTS warehouse_partitions (
        table_name  TEXT NOT NULL,
        ds          TEXT NOT NULL,
        source      TEXT NOT NULL,
        version     TEXT NOT NULL,
        row_count   {int} NOT NULL,
        byte_count  {int} NOT NULL,
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
# A version names a folder (and a Trino partition location): plain characters only.
_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


def version_prefix(table: str, ds: str | date, source: str, version: str) -> str:
    """`<table>/ds=D/source=S/<version>`: where a version's file is, under the warehouse root."""
    model_for(table)
    if not _VERSION.fullmatch(version):
        raise ValueError(f"not a partition version name: {version!r}")
    return f"{table}/ds={validate_ds(ds)}/source={validate_source(source)}/{version}"


@dataclass(frozen=True, kw_only=True)
class CurrentVersion:
    """A partition's version and its figures (counted when it was written)."""

    version: str
    rows: int
    bytes: int


class PartitionVersions:
    """The pointer table in the store `location` names (the ledger's: where the leases are)."""

    def __init__(self, location: StateLocation) -> None:
        self.location = location

    def create(self) -> None:
        """The tables, if new: before the first switch, which runs inside the fence's
        transaction (creating them there would nest one)."""
        with connect_state(self.location) as db:
            db.create(_SCHEMA)

    def _reader(self) -> StateDatabase | None:
        """The store for reading, or None when nothing was ever switched (a reader creates
        nothing: `status` and exports never make the ledger)."""
        db = read_state(self.location)
        if db is not None and not db.columns("warehouse_partitions"):
            db.close()
            return None
        return db

    def current(self, table: str, ds: str | date, source: str) -> CurrentVersion | None:
        db = self._reader()
        if db is None:
            return None
        with db:
            row = db.execute(
                "SELECT version, row_count, byte_count FROM warehouse_partitions "
                "WHERE table_name = ? AND ds = ? AND source = ?",
                (table, validate_ds(ds), validate_source(source)),
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

    def expect(self, prefix: str, *, within_s: float) -> None:
        """A version about to be written: garbage unless switched to within `within_s` (its
        writer was killed mid-upload, or lost its lease)."""
        with connect_state(self.location) as db:
            _collect(db, prefix, time.time() + within_s)

    def switch(
        self,
        guard: Fence | None,
        partition: tuple[str, str, str],
        current: CurrentVersion,
        *,
        grace_s: float,
    ) -> str | None:
        """Make `current` the partition's version, committed in `guard`'s fence (LeaseLostError:
        nothing switched; None: a write without a lease, a tool's or a test's); the old version
        becomes garbage due in `grace_s`. Returns the old version's prefix (None: there was
        none)."""
        table, ds, source = partition[0], validate_ds(partition[1]), validate_source(partition[2])
        new = version_prefix(table, ds, source, current.version)
        with guard.fenced() if guard is not None else self._transaction() as db:
            row = db.execute(
                "SELECT version FROM warehouse_partitions "
                "WHERE table_name = ? AND ds = ? AND source = ?",
                (table, ds, source),
            ).fetchone()
            db.execute(
                "INSERT INTO warehouse_partitions "
                "(table_name, ds, source, version, row_count, byte_count, switched_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (table_name, ds, source) DO UPDATE SET "
                "version = excluded.version, row_count = excluded.row_count, "
                "byte_count = excluded.byte_count, "
                "switched_at = excluded.switched_at",
                (table, ds, source, current.version, current.rows, current.bytes, time.time()),
            )
            db.execute("DELETE FROM warehouse_garbage WHERE prefix = ?", (new,))
            if row is None or str(row[0]) == current.version:
                return None
            old = version_prefix(table, ds, source, str(row[0]))
            _collect(db, old, time.time() + grace_s)
            return old

    @contextmanager
    def _transaction(self) -> Iterator[StateDatabase]:
        with connect_state(self.location) as db, db.transaction():
            yield db

    def due(self, *, limit: int = 100) -> list[str]:
        """Garbage prefixes whose time has come, oldest first."""
        db = self._reader()
        if db is None:
            return []
        with db:
            rows = db.execute(
                "SELECT prefix FROM warehouse_garbage WHERE due_at <= ? ORDER BY due_at LIMIT ?",
                (time.time(), limit),
            ).fetchall()
        return [str(prefix) for (prefix,) in rows]

    def forget(self, prefix: str) -> None:
        """A garbage prefix deleted from the store (or never written)."""
        with connect_state(self.location) as db:
            db.execute("DELETE FROM warehouse_garbage WHERE prefix = ?", (prefix,))


def _collect(db: StateDatabase, prefix: str, due_at: float) -> None:
    db.execute(
        "INSERT INTO warehouse_garbage (prefix, due_at) VALUES (?, ?) "
        "ON CONFLICT (prefix) DO UPDATE SET due_at = excluded.due_at",
        (prefix, due_at),
    )
