"""Maintenance: expired snapshots and their files go, tagged and current ones stay, the metadata
stays bounded."""

from __future__ import annotations

import os
import sqlite3
import time
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pyarrow.fs import FileSelector, FileType
from pydantic import SecretStr
from pyiceberg.io.pyarrow import PyArrowFileIO

from kimi_batch.storage import StorageError
from kimi_batch.warehouse import Warehouse
from kimi_batch.warehouse.maintenance import maintain, referenced_files
from kimi_batch_tests.support.rows import amplified
from kimi_batch_tests.support.s3proxy import WarehouseFactory

# Its slow tests start no llama-server: they run beside the ones that do (support/slow_split.py).
pytestmark = pytest.mark.no_llama_server

NIGHTS = 12


def _files(warehouse: Warehouse, table: str) -> set[str]:
    iceberg = warehouse.iceberg_table(table)
    assert iceberg is not None
    root = Path(iceberg.location().removeprefix("file://"))
    return {str(path) for path in root.rglob("*") if path.is_file()}


def _age(paths: set[str], seconds: float) -> None:
    """Make files look `seconds` old (the orphan safety age is by modification time)."""
    then = time.time() - seconds
    for path in paths:
        os.utime(path, (then, then))


def test_maintenance_expires_old_snapshots_keeps_tagged_ones_and_bounds_metadata(
    tmp_path: Path,
) -> None:
    warehouse = Warehouse(tmp_path / "warehouse")
    tagged: int | None = None
    for night in range(NIGHTS):
        for day in (1, 2):
            rows = amplified(night + day, prefix=f"n{night}")
            warehouse.write_partition("amplified", f"2024-05-0{day}", "demo", rows)
        if night == 2:
            iceberg = warehouse.iceberg_table("amplified")
            assert iceberg is not None
            tagged = iceberg.metadata.current_snapshot_id
            assert tagged is not None
            iceberg.manage_snapshots().create_tag(tagged, "night-2024-05-03").commit()
    before = warehouse.iceberg_table("amplified")
    assert before is not None
    assert tagged is not None
    current = before.metadata.current_snapshot_id
    assert len(before.metadata.snapshots) >= 2 * NIGHTS
    stray = tmp_path / "warehouse/kimi_batch/amplified/data/ds=2024-05-01/source=demo/stray.parquet"
    stray.write_bytes(b"a killed writer's file")
    _age(_files(warehouse, "amplified"), 2 * 86400)
    fresh = stray.with_name("in-flight.parquet")  # a commit in flight: too young to remove
    fresh.write_bytes(b"not committed yet")

    (report,) = maintain(warehouse, retention=timedelta(0), now=datetime.now(UTC))

    after = warehouse.iceberg_table("amplified")
    assert after is not None
    assert {s.snapshot_id for s in after.metadata.snapshots} == {current, tagged}
    assert report.snapshots_expired == len(before.metadata.snapshots) - 2
    assert report.snapshots_kept == 2
    # The tagged night still reads as it was; the current state is untouched.
    assert warehouse.pinned({"amplified": tagged}).count("amplified") == 3 + 4
    assert warehouse.count("amplified") == NIGHTS + NIGHTS + 1
    # Every file left is one the metadata names, but the one too young to judge.
    left = _files(warehouse, "amplified")
    assert not stray.exists()
    assert left - referenced_files(after) == {str(fresh)}
    assert report.files_removed > 2 * NIGHTS
    assert report.manifests <= 20  # merged: bounded however many nights went by
    assert report.metadata_bytes < 64 * 1024


def test_maintenance_within_the_retention_keeps_everything(tmp_path: Path) -> None:
    warehouse = Warehouse(tmp_path / "warehouse")
    for night in range(3):
        warehouse.write_partition("amplified", "2024-05-01", "demo", amplified(night + 1))
    files = _files(warehouse, "amplified")

    (report,) = maintain(warehouse, retention=timedelta(days=7))

    assert (report.snapshots_expired, report.files_removed) == (0, 0)
    assert _files(warehouse, "amplified") == files
    # A table never written is skipped, and nothing is created for it.
    assert maintain(Warehouse(tmp_path / "other" / "warehouse"), retention=timedelta(0)) == []


def test_maintenance_on_either_warehouse_kind_removes_what_nothing_names(
    tmp_path: Path, warehouse_kind: WarehouseFactory
) -> None:
    """The listing and deletion go through pyiceberg's file IO: a folder or an s3:// prefix."""
    warehouse = warehouse_kind(tmp_path)
    for rows in (3, 2, 4):
        warehouse.write_partition("amplified", "2024-05-01", "demo", amplified(rows))
    iceberg = warehouse.iceberg_table("amplified")
    assert iceberg is not None
    io = iceberg.io
    assert isinstance(io, PyArrowFileIO)
    with io.new_output(f"{iceberg.location()}/data/stray.parquet").create() as out:
        out.write(b"a killed writer's file")

    later = datetime.now(UTC) + timedelta(days=2)  # every file is past the safety age
    (report,) = maintain(warehouse, retention=timedelta(0), now=later)

    after = warehouse.iceberg_table("amplified")
    assert after is not None
    assert len(after.metadata.snapshots) == 1
    assert report.files_removed >= 3  # the stray file and the replaced partitions' files
    scheme, netloc, root = io.parse_location(after.location(), io.properties)
    listing = io.fs_by_scheme(scheme, netloc).get_file_info(FileSelector(root, recursive=True))
    left = {info.path for info in listing if info.type == FileType.File}
    assert left <= referenced_files(after)
    assert warehouse.read_partition("amplified", "2024-05-01", "demo").height == 4


def test_a_catalog_busy_past_its_timeout_is_one_storage_error(tmp_path: Path) -> None:
    """Found by review: "database is locked" (a night's commits holding the ledger past the
    busy timeout) came out of `warehouse maintain` as a raw SQLAlchemy traceback."""
    written = Warehouse(tmp_path / "warehouse")
    for night in range(3):
        written.write_partition("amplified", "2024-05-01", "demo", amplified(night + 1))
    spec = written.spec
    quick = spec.database.get_secret_value().replace("timeout=60", "timeout=1")
    assert quick != spec.database.get_secret_value()
    warehouse = Warehouse(spec.model_copy(update={"database": SecretStr(quick)}))
    assert spec.sqlite_path is not None
    with closing(sqlite3.connect(spec.sqlite_path, isolation_level=None)) as holder:
        holder.execute("BEGIN IMMEDIATE")  # the write lock, as a night's commit holds it
        with pytest.raises(StorageError, match="could not maintain table amplified"):
            maintain(warehouse, retention=timedelta(0), now=datetime.now(UTC) + timedelta(days=1))
        holder.execute("ROLLBACK")
    (report,) = maintain(
        warehouse, retention=timedelta(0), now=datetime.now(UTC) + timedelta(days=1)
    )
    assert report.snapshots_expired == 2  # once the lock is gone, the same call does the work
