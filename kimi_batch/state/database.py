"""The state database (the ledger, the manifest, the Batch API store, the duplicate index): its one
interface (`StateDatabase`), the default backend (`SqliteDatabase`), and which backend a store
opens (`connect_state`, `read_state`); the optional PostgreSQL backend is `postgres`.

The stores write their SQL once, in the dialect SQLite and PostgreSQL share: `?` placeholders,
`INSERT ... ON CONFLICT`, `RETURNING`, and type tokens in their tables (`{real}`, `{int}`,
`{serial}`, `{blob}`) that each backend spells its way. What differs lives in each backend: how
to connect, the write lock a `transaction` holds, the lease clock, a JSON field as text.

    StateError        the database cannot be reached or used (a KimiBatchError: one clear line)
    └── StateBusyError  transient: SQLite's lock, a dropped PostgreSQL connection; try again
"""

from __future__ import annotations

import sqlite3
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, ClassVar, Protocol

from kimi_batch.errors import KimiBatchError
from kimi_batch.paths import StateLocation, connect_private_db, private_dir
from kimi_batch.redaction import masked_url

# ---- the interface ------------------------------------------------------------------------------


class StateError(KimiBatchError, RuntimeError):
    """A state database cannot be reached or used."""


class StateBusyError(StateError):
    """A transient failure (a lock held too long, a connection lost): the same call may work
    again in a moment."""


class Cursor(Protocol):
    """What `StateDatabase.execute` returns (sqlite3's and psycopg's cursors both are one)."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class StateDatabase(ABC):
    """One connection to one store's tables. Every statement outside `transaction` commits
    on its own (durably); a `transaction` holds the store's write lock across processes and
    machines until it commits, so the decisions made inside it (who takes a lease, which
    source a new file gets) have one winner."""

    kind: ClassVar[str]
    types: ClassVar[dict[str, str]]

    @abstractmethod
    def execute(self, sql: str, params: Sequence[object] = ()) -> Cursor: ...

    @abstractmethod
    def executemany(self, sql: str, rows: Iterable[Sequence[object]]) -> None: ...

    @abstractmethod
    def transaction(self) -> AbstractContextManager[None]:
        """Commit on exit, roll back on an exception; the store's write lock held throughout."""

    def lock_store(self) -> None:
        """Take the store's write lock inside a transaction someone else opened on this
        connection (a catalog commit's): SQLite's first write takes it by itself."""
        return

    @abstractmethod
    def clock(self) -> tuple[str, float]:
        """(clock id, seconds) that lease expiry is measured on: one clock every holder reads
        (the machine's boot clock for SQLite, the database server's for PostgreSQL)."""

    @abstractmethod
    def json_text(self, column: str, key: str) -> str:
        """SQL for the text of the top-level `key` of the JSON in `column`."""

    @abstractmethod
    def columns(self, table: str) -> set[str]:
        """The columns a table has (empty when there is no such table)."""

    @abstractmethod
    def close(self) -> None: ...

    def create(self, statements: Iterable[str]) -> None:
        """Create the store's tables and indexes (`CREATE ... IF NOT EXISTS` with type tokens),
        as one transaction: two processes opening a new store at once both see it whole."""
        with self.transaction():
            for statement in statements:
                self.execute(statement.format(**self.types))

    def add_columns(self, table: str, columns: Iterable[tuple[str, str]]) -> None:
        """Columns added after a table's first release: an older table gets them on open."""
        present = self.columns(table)
        for name, kind in columns:
            if name not in present:
                self.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind.format(**self.types)}")

    @abstractmethod
    def reset_serials(self, table: str, *, given: int = 0) -> None:
        """After rows were copied in with their ids: the next id follows the largest one, and
        `given`, the largest the source ever gave (a deleted newest row's id is not reused)."""

    def __enter__(self) -> StateDatabase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---- the SQLite backend -------------------------------------------------------------------------

# The embedded backend: one SQLite file per store under the state dir (WAL, durable commits).
# `transaction` is `BEGIN IMMEDIATE`: SQLite's write lock, held across the processes of this
# machine. Lease expiry is measured on the machine's boot clock (CLOCK_BOOTTIME: it never jumps
# with NTP or a hand-set date, and every process here reads the same value), named by the boot
# id, so a lease from before a reboot is expired.

_BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")
_CLOCK = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)


def _boot_id() -> str:
    try:
        return _BOOT_ID_FILE.read_text().strip()
    except OSError:
        # No Linux boot id: the wall time of boot, to the minute, tells boots apart well enough.
        return f"boot@{round((time.time() - time.clock_gettime(_CLOCK)) / 60)}"


_THIS_BOOT = _boot_id()


def boot_clock() -> tuple[str, float]:
    """(boot id, seconds since boot): it never jumps, and every process here reads the same."""
    return _THIS_BOOT, time.clock_gettime(_CLOCK)


def _translated(error: sqlite3.Error, path: Path) -> StateError:
    if isinstance(error, sqlite3.OperationalError):  # "database is locked", I/O: transient
        return StateBusyError(f"state database {path}: {error}")
    return StateError(f"state database {path}: {error}")


class SqliteDatabase(StateDatabase):
    """A store's SQLite file, created owner-only (its folder too)."""

    kind: ClassVar[str] = "sqlite"
    types: ClassVar[dict[str, str]] = {
        "real": "REAL",
        "int": "INTEGER",
        "serial": "INTEGER PRIMARY KEY AUTOINCREMENT",
        "blob": "BLOB",
    }

    def __init__(self, path: Path, *, timeout_s: float = 60.0) -> None:
        self.path = path
        private_dir(path.parent)
        try:
            self._db = connect_private_db(path, timeout_s=timeout_s)
        except sqlite3.Error as error:
            raise _translated(error, path) from error

    @classmethod
    def wrap(cls, db: sqlite3.Connection, path: Path) -> SqliteDatabase:
        """An open connection (a read-only one) as a `StateDatabase`."""
        wrapped = cls.__new__(cls)
        wrapped.path, wrapped._db = path, db
        return wrapped

    def execute(self, sql: str, params: Sequence[object] = ()) -> Cursor:
        try:
            return self._db.execute(sql, params)
        except sqlite3.Error as error:
            raise _translated(error, self.path) from error

    def executemany(self, sql: str, rows: Iterable[Sequence[object]]) -> None:
        try:
            self._db.executemany(sql, rows)
        except sqlite3.Error as error:
            raise _translated(error, self.path) from error

    @contextmanager
    def transaction(self) -> Iterator[None]:
        self.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.execute("ROLLBACK")
            raise
        self.execute("COMMIT")

    def clock(self) -> tuple[str, float]:
        return boot_clock()

    def json_text(self, column: str, key: str) -> str:
        return f"json_extract({column}, '$.{key}')"

    def columns(self, table: str) -> set[str]:
        return {row[1] for row in self.execute(f"PRAGMA table_info({table})")}

    def reset_serials(self, table: str, *, given: int = 0) -> None:
        # An AUTOINCREMENT key follows the largest id inserted already; `given` raises its
        # counter, a row of sqlite_sequence (there once the table took its first row).
        if given > self.serials_given(table):
            self.execute("DELETE FROM sqlite_sequence WHERE name = ?", (table,))
            self.execute("INSERT INTO sqlite_sequence (name, seq) VALUES (?, ?)", (table, given))

    def serials_given(self, table: str) -> int:
        """The largest id this table's AUTOINCREMENT key ever gave, its deleted rows' too."""
        known = self.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'sqlite_sequence'"
        ).fetchone()
        if known is None:
            return 0
        row = self.execute("SELECT seq FROM sqlite_sequence WHERE name = ?", (table,)).fetchone()
        return 0 if row is None else int(row[0])

    def tables(self) -> list[str]:
        rows = self.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
            "ORDER BY name"
        )
        return [str(name) for (name,) in rows]

    def close(self) -> None:
        self._db.close()


def read_sqlite(path: Path) -> SqliteDatabase | None:
    """The store read-only, or None when it was never created: no writer is opened (no WAL
    switch, no schema), so a reader beside a running batch holds no write lock and a status
    call never creates the file."""
    if not path.is_file():
        return None
    try:
        # As a URI, percent-encoded: a '#' or '?' in a folder's name would end the path there
        # (SQLite opened, and created, a file beside the state folder: a migration copied none
        # of the store's rows and said so as a success).
        db = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True, timeout=30)
    except sqlite3.Error as error:
        raise _translated(error, path) from error
    return SqliteDatabase.wrap(db, path)


# ---- which backend a store opens ----------------------------------------------------------------

# The PostgreSQL backend is imported where it is chosen: it builds on the interface above, and
# psycopg costs every process that loads the code location ~0.4 s, which the embedded default
# never uses.


def connect_state(location: StateLocation, *, timeout_s: float = 60.0) -> StateDatabase:
    """The store's database, created if new: its SQLite file, or its PostgreSQL schema."""
    if location.url is None:
        return SqliteDatabase(location.path, timeout_s=timeout_s)
    from kimi_batch.state.postgres import PostgresDatabase

    return PostgresDatabase(location.url, location.schema_name, timeout_s=timeout_s)


def read_state(location: StateLocation) -> StateDatabase | None:
    """The store for reading only, or None when it was never written (nothing is created)."""
    if location.url is None:
        return read_sqlite(location.path)
    from kimi_batch.state.postgres import read_postgres

    return read_postgres(location.url, location.schema_name)


def shown_location(location: StateLocation) -> str:
    """Where the store is, as messages and `status` name it (no password)."""
    if location.url is None:
        return str(location.path)
    return f"{masked_url(location.url)} (schema {location.schema_name})"
