"""The one interface of the state databases (the ledger, the manifest, the Batch API store, the
duplicate index), and which backend a store opens (`connect_state`, `read_state`).

The stores write their SQL once, in the dialect SQLite and PostgreSQL share: `?` placeholders,
`INSERT ... ON CONFLICT`, `RETURNING`, and type tokens in their tables (`{real}`, `{int}`,
`{serial}`, `{blob}`) that each backend spells its way. What differs lives in one module per backend (`sqlite`, `postgres`):
how to connect, the write lock a `transaction` holds, the lease clock, a JSON field as text.

    StateError        the database cannot be reached or used (a KimiBatchError: one clear line)
    └── StateBusyError  transient: SQLite's lock, a dropped PostgreSQL connection; try again
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar, Protocol

from kimi_batch.errors import KimiBatchError
from kimi_batch.paths import StateLocation
from kimi_batch.redaction import masked_url


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


# ---- which backend a store opens ----------------------------------------------------------------

# Each backend is imported where it is chosen: the backends build on the interface above, and
# psycopg costs every process that loads the code location ~0.4 s, which the embedded default
# never uses.


def connect_state(location: StateLocation, *, timeout_s: float = 60.0) -> StateDatabase:
    """The store's database, created if new: its SQLite file, or its PostgreSQL schema."""
    if location.url is None:
        from kimi_batch.state.sqlite import SqliteDatabase

        return SqliteDatabase(location.path, timeout_s=timeout_s)
    from kimi_batch.state.postgres import PostgresDatabase

    return PostgresDatabase(location.url, location.schema_name, timeout_s=timeout_s)


def read_state(location: StateLocation) -> StateDatabase | None:
    """The store for reading only, or None when it was never written (nothing is created)."""
    if location.url is None:
        from kimi_batch.state.sqlite import read_sqlite

        return read_sqlite(location.path)
    from kimi_batch.state.postgres import read_postgres

    return read_postgres(location.url, location.schema_name)


def shown_location(location: StateLocation) -> str:
    """Where the store is, as messages and `status` name it (no password)."""
    if location.url is None:
        return str(location.path)
    return f"{masked_url(location.url)} (schema {location.schema_name})"
