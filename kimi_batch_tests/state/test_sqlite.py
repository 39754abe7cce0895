"""The SQLite backend's serial counter: what a migration reads from it and gives it."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

from kimi_batch.state.database import SqliteDatabase, read_sqlite


def test_the_counter_remembers_a_deleted_newest_id_and_can_be_raised(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    with closing(sqlite3.connect(path)) as db, db:
        db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY AUTOINCREMENT, x TEXT)")
        db.execute("CREATE TABLE plain (x TEXT)")
        db.execute("INSERT INTO t (x) VALUES ('a'), ('b'), ('c')")
        db.execute("DELETE FROM t WHERE id = 3")
    source = read_sqlite(path)
    assert source is not None
    with source:
        assert (source.serials_given("t"), source.serials_given("plain")) == (3, 0)

    with SqliteDatabase(path) as db:
        db.reset_serials("t", given=7)
        db.reset_serials("t", given=2)  # never lowered
        db.execute("INSERT INTO t (x) VALUES ('d')")
        assert db.execute("SELECT max(id) FROM t").fetchone() == (8,)


def test_a_file_without_a_counter_gave_nothing(tmp_path: Path) -> None:
    with closing(sqlite3.connect(tmp_path / "plain.db")) as db, db:
        db.execute("CREATE TABLE plain (x TEXT)")
    with closing(SqliteDatabase(tmp_path / "plain.db")) as db:
        assert db.serials_given("plain") == 0
        db.reset_serials("plain")  # no sqlite_sequence: nothing to raise


def test_a_store_in_a_folder_whose_name_holds_uri_marks_is_read_where_it_is(
    tmp_path: Path,
) -> None:
    """Found by review: the read-only URI ended the path at a '#' or '?', so the reader opened
    (and created) `run` beside the folder: an empty store, every row of the real one unread."""
    folder = tmp_path / "run#1?x=%41 b"
    folder.mkdir()
    with closing(sqlite3.connect(folder / "store.db")) as db, db:
        db.execute("CREATE TABLE t (x TEXT)")
        db.execute("INSERT INTO t (x) VALUES ('kept')")

    source = read_sqlite(folder / "store.db")

    assert source is not None
    with source:
        assert source.execute("SELECT x FROM t").fetchall() == [("kept",)]
    assert sorted(path.name for path in tmp_path.iterdir()) == [folder.name]
