"""A Hive-layout warehouse (the layout before issue 43) copied into the Iceberg tables."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path

import polars as pl
import pytest
from pydantic import BaseModel

from kimi_batch.paths import StatePaths
from kimi_batch.warehouse import Warehouse, polars_schema
from kimi_batch.warehouse.migration import MigrationError, hive_partitions, migrate
from kimi_batch_tests.support.rows import amplified, distilled


def _old_file(root: Path, table: str, ds: str, source: str, rows: Sequence[BaseModel]) -> Path:
    """A partition as the old writer left it: `<table>/ds=D/source=S/part-0.parquet`."""
    folder = root / table / f"ds={ds}" / f"source={source}"
    folder.mkdir(parents=True, exist_ok=True)
    frame = pl.DataFrame([row.model_dump() for row in rows], schema=polars_schema(table))
    frame.write_parquet(folder / "part-0.parquet")
    return folder / "part-0.parquet"


def _old_warehouse(root: Path) -> None:
    _old_file(root, "amplified", "2024-05-01", "demo", amplified(3))
    _old_file(root, "amplified", "2024-05-02", "demo", amplified(2, prefix="b"))
    _old_file(root, "distilled", "2024-05-01", "demo", distilled(amplified(4)))
    _old_file(root, "amplified", "2024-05-03", "demo", [])  # a partition written empty
    # Written before a column was added (input_sha256): it reads as null.
    old = _old_file(root, "amplified", "2024-05-04", "web", amplified(1, prefix="o"))
    pl.read_parquet(old).drop("input_sha256").write_parquet(old)
    # Not the old writer's: a temporary file, a folder that is no partition.
    (old.parent / ".part-0.parquet.x.tmp").write_bytes(b"junk")
    (root / "amplified" / "notes").mkdir()


def test_a_hive_warehouse_becomes_iceberg_tables_with_the_same_rows(tmp_path: Path) -> None:
    root = tmp_path / "warehouse"
    _old_warehouse(root)
    warehouse = Warehouse(root)

    done = migrate(warehouse, hive_partitions(root, None))

    assert {(m.table, m.ds, m.source, m.action, m.rows_file, m.rows_table) for m in done} == {
        ("amplified", "2024-05-01", "demo", "copied", 3, 3),
        ("amplified", "2024-05-02", "demo", "copied", 2, 2),
        ("amplified", "2024-05-03", "demo", "empty", 0, 0),
        ("amplified", "2024-05-04", "web", "copied", 1, 1),
        ("distilled", "2024-05-01", "demo", "copied", 4, 4),
    }
    assert warehouse.count("amplified") == 6
    assert warehouse.count("distilled") == 4
    copied = warehouse.read_partition("amplified", "2024-05-01", "demo")
    old = pl.read_parquet(root / "amplified/ds=2024-05-01/source=demo/part-0.parquet")
    assert copied.drop("ds", "source").equals(old)  # the rows as they were, not regenerated
    assert warehouse.read_partition("amplified", "2024-05-04", "web")["input_sha256"].to_list() == [
        None
    ]
    # The old files stay where they were.
    assert (root / "amplified/ds=2024-05-01/source=demo/part-0.parquet").is_file()


def test_a_rerun_copies_nothing_twice_and_leaves_newer_partitions_alone(tmp_path: Path) -> None:
    root = tmp_path / "warehouse"
    _old_warehouse(root)
    warehouse = Warehouse(root)
    migrate(warehouse, hive_partitions(root, None))
    # A night since the upgrade rewrote one partition in the table.
    warehouse.write_partition("amplified", "2024-05-02", "demo", amplified(5, prefix="new"))

    again = migrate(warehouse, hive_partitions(root, None))

    assert {m.action for m in again if m.rows_file} == {"present"}
    assert warehouse.count("amplified") == 3 + 5 + 1
    replaced = migrate(warehouse, hive_partitions(root, None), replace=True)
    assert {m.action for m in replaced if m.rows_file} == {"copied"}
    assert warehouse.count("amplified") == 6
    assert warehouse.count("distilled") == 4


def test_an_object_store_s_current_versions_come_from_the_pointer_table(tmp_path: Path) -> None:
    paths = StatePaths(home=tmp_path)
    paths.ledger_path.parent.mkdir(parents=True)
    with sqlite3.connect(paths.ledger_path) as db:
        db.execute(
            "CREATE TABLE warehouse_partitions (table_name TEXT, ds TEXT, source TEXT, "
            "version TEXT, row_count INTEGER, byte_count INTEGER, switched_at REAL)"
        )
        db.execute(
            "INSERT INTO warehouse_partitions VALUES "
            "('amplified', '2024-05-01', 'demo', 'v2', 3, 10, 0)"
        )

    found = hive_partitions("s3://bucket/wh/", paths.ledger_state)

    assert [p.file for p in found] == [
        "s3://bucket/wh/amplified/ds=2024-05-01/source=demo/v2/part-0.parquet"
    ]
    with pytest.raises(MigrationError, match="no such warehouse folder"):
        hive_partitions(tmp_path / "missing", None)


def test_an_unreadable_file_of_a_partition_already_copied_is_a_migration_error(
    tmp_path: Path,
) -> None:
    """Found by review: counting such a file's rows raised polars' own error (a traceback out
    of `kimi-batch warehouse migrate`); reading one to copy was already a MigrationError."""
    root = tmp_path / "warehouse"
    _old_warehouse(root)
    warehouse = Warehouse(root)
    migrate(warehouse, hive_partitions(root, None))
    (root / "amplified/ds=2024-05-01/source=demo/part-0.parquet").write_bytes(b"not parquet")

    with pytest.raises(MigrationError, match=r"part-0\.parquet: unreadable"):
        migrate(warehouse, hive_partitions(root, None))
