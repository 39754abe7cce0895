"""The embedded backend: one SQLite file per store under the state dir (WAL, durable commits).

`transaction` is `BEGIN IMMEDIATE`: SQLite's write lock, held across the processes of this
machine. Lease expiry is measured on the machine's boot clock (CLOCK_BOOTTIME: it never jumps
with NTP or a hand-set date, and every process here reads the same value), named by the boot
id, so a lease from before a reboot is expired.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar

from kimi_batch.paths import connect_private_db, private_dir
from kimi_batch.state.database import Cursor, StateBusyError, StateDatabase, StateError

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
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    except sqlite3.Error as error:
        raise _translated(error, path) from error
    return SqliteDatabase.wrap(db, path)
