"""Copying a store's SQLite file into another backend (`kimi-batch state migrate --to URL`).

The target's tables are created first by the store itself (its own `create`), so a copy never
guesses a schema; then every row of the file's tables goes over in one transaction under the
target store's write lock, ids included (a landed version stays the newest, a batch keeps its
place in the list). A target store that already holds rows is left as it is: a migration that
finished is never copied twice, and one that failed left nothing (its transaction rolled back).
"""

from __future__ import annotations

from collections.abc import Collection
from itertools import islice
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.crash_points import crash_point
from kimi_batch.state.database import SqliteDatabase, StateDatabase, StateError, read_sqlite

_CHUNK = 1000


class StoreCopy(BaseModel):
    """What one store's migration did."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    store: str
    rows: dict[str, int] = Field(default_factory=dict, description="Rows copied, per table.")
    skipped: str | None = Field(default=None, description="Why nothing was copied, if so.")
    files: int = Field(
        default=0, description="Files (landed snapshots, Batch API files) put into the database."
    )
    missing_files: list[str] = Field(
        default_factory=list, description="Files its rows name that this box does not have."
    )


def copy_store(
    store: str, source: Path, target: StateDatabase, *, leave_out: Collection[str] = ()
) -> StoreCopy:
    """Copy the tables of the SQLite file `source` (those the target has, but `leave_out`)
    into `target`, whose tables the store created already."""
    db = read_sqlite(source)
    if db is None:
        return StoreCopy(store=store, skipped=f"no {source}: nothing to copy")
    with db:
        _refuse_unplaced(store, db, target, leave_out)
        tables = [t for t in db.tables() if t not in leave_out and target.columns(t)]
        holding = [t for t in tables if target.execute(f"SELECT 1 FROM {t} LIMIT 1").fetchone()]
        if holding:
            return StoreCopy(
                store=store, skipped=f"the target already holds rows ({', '.join(holding)})"
            )
        copied: dict[str, int] = {}
        with target.transaction():
            for table in tables:
                copied[table] = _copy_table(db, target, table)
                target.reset_serials(table, given=db.serials_given(table))
        crash_point("state.store_copied")
    return StoreCopy(store=store, rows=copied)


# What a table of an older version holds, and what moves it instead of a copy.
_MOVED_ELSEWHERE = {
    "warehouse_partitions": "the version pointers of an object-store warehouse: run "
    "`kimi-batch warehouse migrate` first, which makes them Iceberg tables",
}


def _refuse_unplaced(
    store: str, source: SqliteDatabase, target: StateDatabase, leave_out: Collection[str]
) -> None:
    """A table holding rows that the target has no table for would be left behind, silently:
    refused, naming it, before anything is copied."""
    for table in source.tables():
        if table in leave_out or target.columns(table):
            continue
        (rows,) = source.execute(f"SELECT count(*) FROM {table}").fetchone()
        if rows:
            why = _MOVED_ELSEWHERE.get(table, "a table this version does not have")
            raise StateError(
                f"{store}: table {table} ({rows} rows) has no place in the target, so its rows "
                f"would be lost; it holds {why}"
            )


def _copy_table(source: StateDatabase, target: StateDatabase, table: str) -> int:
    columns = sorted(source.columns(table) & target.columns(table))
    names = ", ".join(columns)
    insert = f"INSERT INTO {table} ({names}) VALUES ({', '.join('?' * len(columns))})"
    rows = iter(source.execute(f"SELECT {names} FROM {table}"))
    count = 0
    while chunk := list(islice(rows, _CHUNK)):
        target.executemany(insert, chunk)
        count += len(chunk)
    return count
