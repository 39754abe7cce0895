"""The Parquet warehouse: Hive layout, atomic replace, explicit schema, validated partitions.

The tests of the storage contract run on both warehouse kinds (`warehouse_kind`: the local
folder, an s3:// prefix on the session's S3 server); the others test the local files."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, timezone
from pathlib import Path

import polars as pl
import pytest

from kimi_batch.crash_points import CrashPointReached, armed
from kimi_batch.storage import (
    TABLES,
    InvalidIdentifierError,
    InvalidPartitionError,
    Warehouse,
    polars_schema,
)
from kimi_batch.storage.parquet import PART_FILE
from kimi_batch.tasks.rows import DistilledRow
from kimi_batch_tests.support.rows import CREATED_AT, amplified, distilled, quarantined
from kimi_batch_tests.support.s3proxy import WarehouseFactory

DS = "2024-05-01"


def test_layout_and_round_trip(tmp_path: Path) -> None:
    warehouse = Warehouse(tmp_path)
    rows = amplified(3)
    written = warehouse.write_partition("amplified", DS, "demo", rows)

    assert written.path == tmp_path / "amplified" / f"ds={DS}" / "source=demo" / PART_FILE
    assert (written.rows, written.table, written.ds, written.source) == (3, "amplified", DS, "demo")
    assert written.bytes == written.path.stat().st_size > 0
    frame = warehouse.read_partition("amplified", DS, "demo")
    assert frame.schema == polars_schema("amplified", partitions=True)
    assert frame["request_id"].to_list() == [row.request_id for row in rows]
    assert frame["ds"].unique().to_list() == [DS]
    assert frame["source"].unique().to_list() == ["demo"]
    # Stored as naive UTC with microseconds.
    assert frame["created_at"][0] == CREATED_AT.replace(tzinfo=None)


def test_an_exception_right_after_a_partitions_commit_leaves_it_readable_at_the_new_version(
    tmp_path: Path, warehouse_kind: WarehouseFactory
) -> None:
    # Issue 42 item 3: a run terminated (or a COMMIT that failed ambiguously) just after the
    # partition's commit. The object-store writer used to delete the version its pointer had just
    # been switched to, and every later read failed.
    warehouse = warehouse_kind(tmp_path)
    warehouse.write_partition("amplified", DS, "demo", amplified(3))
    new = amplified(2, prefix="new")
    with armed("warehouse.partition_committed"), pytest.raises(CrashPointReached):
        warehouse.write_partition("amplified", DS, "demo", new)

    after = warehouse_kind(tmp_path)  # the next run's warehouse, on the same state
    assert after.read_partition("amplified", DS, "demo")["request_id"].to_list() == [
        row.request_id for row in new
    ]
    assert after.count("amplified") == 2
    assert after.partitions("amplified") == [(DS, "demo")]


def test_nested_logprobs_round_trip(tmp_path: Path, warehouse_kind: WarehouseFactory) -> None:
    warehouse = warehouse_kind(tmp_path)
    warehouse.write_partition("distilled", DS, "demo", distilled(amplified(2)))
    frame = warehouse.read_table("distilled")
    first = frame["logprobs"][0].to_list()
    assert first == [
        {
            "token": "Paris",
            "logprob": -0.25,
            "top": [
                {"token": "Paris", "logprob": -0.25, "id": None},
                {"token": "Lyon", "logprob": -2.5, "id": None},
            ],
            "id": None,
        }
    ]


def test_logprobs_written_before_token_ids_were_kept_read_with_null_ids(tmp_path: Path) -> None:
    """A partition file of an older version (logprobs without `id`) reads whole, by rows and
    by scan, its ids null."""
    warehouse = Warehouse(tmp_path / "wh")
    warehouse.write_partition("distilled", DS, "demo", distilled(amplified(2)))
    path = warehouse.partition_file("distilled", DS, "demo")
    frame = pl.read_parquet(path)
    old = pl.List(
        pl.Struct(
            {
                "token": pl.String,
                "logprob": pl.Float64,
                "top": pl.List(pl.Struct({"token": pl.String, "logprob": pl.Float64})),
            }
        )
    )
    frame.with_columns(
        pl.col("logprobs").list.eval(
            pl.struct(
                pl.element().struct.field("token"),
                pl.element().struct.field("logprob"),
                pl.element()
                .struct.field("top")
                .list.eval(
                    pl.struct(
                        pl.element().struct.field("token"), pl.element().struct.field("logprob")
                    )
                ),
            )
        )
    ).cast({"logprobs": old}).write_parquet(path)
    assert pl.read_parquet(path).schema["logprobs"] == old
    (row, *_) = warehouse.read_rows("distilled", DS, "demo", DistilledRow)
    assert row.logprobs is not None
    assert (row.logprobs[0].token, row.logprobs[0].id, row.logprobs[0].top[0].id) == (
        "Paris",
        None,
        None,
    )
    scanned = warehouse.scan("distilled").select("logprobs").collect()
    assert scanned["logprobs"][0].to_list()[0]["id"] is None


def test_aware_datetimes_are_stored_as_utc(
    tmp_path: Path, warehouse_kind: WarehouseFactory
) -> None:
    warehouse = warehouse_kind(tmp_path)
    plus_two = timezone(timedelta(hours=2))
    row = amplified(1)[0].model_copy(
        update={"created_at": datetime(2024, 5, 1, 14, 0, tzinfo=plus_two)}
    )
    warehouse.write_partition("amplified", DS, "demo", [row])
    assert warehouse.read_table("amplified")["created_at"][0] == datetime(2024, 5, 1, 12, 0)


def test_a_written_partition_is_known_with_its_file_schema(
    tmp_path: Path, warehouse_kind: WarehouseFactory
) -> None:
    warehouse = warehouse_kind(tmp_path)
    assert not warehouse.has_partition("amplified", DS, "demo")
    written = warehouse.write_partition("amplified", DS, "demo", [])  # zero rows: still written
    assert warehouse.has_partition("amplified", DS, "demo")
    assert not warehouse.has_partition("amplified", DS, "other")
    assert warehouse.partition_schema("amplified", DS, "demo") == dict(polars_schema("amplified"))
    assert written.location.startswith(warehouse.location)


def test_rewrite_replaces_never_appends(tmp_path: Path, warehouse_kind: WarehouseFactory) -> None:
    warehouse = warehouse_kind(tmp_path)
    warehouse.write_partition("amplified", DS, "demo", amplified(5))
    warehouse.write_partition("amplified", DS, "demo", amplified(5))
    assert warehouse.count("amplified") == 5
    assert warehouse.read_table("amplified")["request_id"].n_unique() == 5

    warehouse.write_partition("amplified", DS, "demo", amplified(2, prefix="new"))
    frame = warehouse.read_table("amplified")
    assert frame["request_id"].to_list() == ["new-0", "new-1"]
    assert warehouse.scan("amplified").select("request_id").collect().height == 2


def test_failed_write_keeps_old_partition(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    warehouse = Warehouse(tmp_path)
    warehouse.write_partition("amplified", DS, "demo", amplified(3))

    def broken_write(self: pl.DataFrame, file: Path, **_: object) -> None:
        Path(file).write_bytes(b"PAR1 half a file")
        raise OSError("disk full")

    monkeypatch.setattr(pl.DataFrame, "write_parquet", broken_write)
    with pytest.raises(OSError, match="disk full"):
        warehouse.write_partition("amplified", DS, "demo", amplified(7))
    monkeypatch.undo()

    assert warehouse.count("amplified") == 3
    directory = warehouse.partition_dir("amplified", DS, "demo")
    assert sorted(path.name for path in directory.iterdir()) == [PART_FILE]


def test_wrong_row_type_is_rejected_before_writing(
    tmp_path: Path, warehouse_kind: WarehouseFactory
) -> None:
    warehouse = warehouse_kind(tmp_path)
    warehouse.write_partition("amplified", DS, "demo", amplified(1))
    with pytest.raises(TypeError, match="AmplifiedRow"):
        warehouse.write_partition("amplified", DS, "demo", quarantined(1))
    assert warehouse.count("amplified") == 1


def test_stale_part_files_are_removed(tmp_path: Path) -> None:
    warehouse = Warehouse(tmp_path)
    warehouse.write_partition("amplified", DS, "demo", amplified(2))
    stale = warehouse.partition_dir("amplified", DS, "demo") / "part-1.parquet"
    warehouse.read_partition("amplified", DS, "demo").drop("ds", "source").write_parquet(stale)
    warehouse.write_partition("amplified", DS, "demo", amplified(2))
    assert not stale.exists()
    assert warehouse.count("amplified") == 2


def test_empty_partition_keeps_schema(tmp_path: Path) -> None:
    warehouse = Warehouse(tmp_path)
    written = warehouse.write_partition("quarantine", date(2024, 5, 2), "empty", [])

    assert written.rows == 0
    assert written.path.is_file()
    assert warehouse.partitions("quarantine") == [("2024-05-02", "empty")]
    assert pl.read_parquet_schema(written.path) == dict(polars_schema("quarantine"))
    frame = warehouse.read_table("quarantine")
    assert frame.height == 0
    assert frame.schema == polars_schema("quarantine", partitions=True)
    assert warehouse.count("quarantine") == 0


def test_null_only_columns_keep_their_types(tmp_path: Path) -> None:
    warehouse = Warehouse(tmp_path)
    rows = [
        row.model_copy(update={"strategy": None, "origin": "seed"})
        for row in distilled(amplified(3), with_logprobs=False)
    ]
    written = warehouse.write_partition("distilled", DS, "demo", rows)
    file_schema = pl.read_parquet_schema(written.path)
    assert file_schema["logprobs"] == polars_schema("distilled")["logprobs"]
    assert file_schema["structured"] == pl.String
    assert file_schema["strategy"] == pl.String
    frame = warehouse.read_table("distilled")
    assert frame.schema == polars_schema("distilled", partitions=True)
    assert frame["logprobs"].null_count() == 3


def test_nothing_written_reads_empty(tmp_path: Path, warehouse_kind: WarehouseFactory) -> None:
    warehouse = warehouse_kind(tmp_path / "missing")
    for table in TABLES:
        assert warehouse.partitions(table) == []
        assert warehouse.count(table) == 0
        assert warehouse.read_table(table).schema == polars_schema(table, partitions=True)
    assert warehouse.read_partition("amplified", DS, "x").height == 0


def test_a_scan_reads_older_files_in_the_table_s_schema(tmp_path: Path) -> None:
    """A file written before a column was added (`input_sha256`) scans beside a newer one."""
    warehouse = Warehouse(tmp_path)
    older, newer = quarantined(2)
    warehouse.write_partition("quarantine", DS, "old", [older])
    old_file = warehouse.partition_file("quarantine", DS, "old")
    pl.read_parquet(old_file).drop("input_sha256").write_parquet(old_file)
    warehouse.write_partition(
        "quarantine", DS, "new", [newer.model_copy(update={"input_sha256": "f" * 64})]
    )
    scanned = warehouse.scan("quarantine").select("reason", "input_sha256").collect()
    assert scanned.height == 2
    assert sorted(scanned["input_sha256"].to_list(), key=str) == [None, "f" * 64]
    assert warehouse.scan("amplified").collect().schema == polars_schema("amplified")


def test_partitions_and_tables_listing(tmp_path: Path) -> None:
    warehouse = Warehouse(tmp_path)
    warehouse.write_partition("amplified", "2024-05-02", "b", amplified(1))
    warehouse.write_partition("amplified", "2024-05-01", "a.v2", amplified(2))
    warehouse.write_partition("amplified", "2024-05-01", "b", amplified(3))
    # A directory without its file (a crashed first write) is not a partition.
    (tmp_path / "amplified" / "ds=2024-05-03" / "source=c").mkdir(parents=True)
    assert warehouse.partitions("amplified") == [
        ("2024-05-01", "a.v2"),
        ("2024-05-01", "b"),
        ("2024-05-02", "b"),
    ]
    assert warehouse.count("amplified") == 6
    assert warehouse.tables() == ["amplified"]
    frame = warehouse.read_table("amplified")
    assert frame.group_by("ds", "source").len().sort("ds", "source")["len"].to_list() == [2, 3, 1]


@pytest.mark.parametrize(
    "ds",
    ["2024-13-01", "2024-02-30", "2024/05/01", "20240501", "../../etc", "", "2024-05-01 ", "x"],
)
def test_bad_ds_is_rejected(tmp_path: Path, ds: str) -> None:
    with pytest.raises(InvalidPartitionError):
        Warehouse(tmp_path).write_partition("amplified", ds, "demo", amplified(1))
    assert list(tmp_path.iterdir()) == []


def test_datetime_is_not_a_ds(tmp_path: Path) -> None:
    with pytest.raises(InvalidPartitionError):
        Warehouse(tmp_path).write_partition("amplified", datetime.now(UTC), "demo", [])


@pytest.mark.parametrize(
    "source",
    ["", "a/b", "..", ".hidden", "_tmp", "x y", "x;y", "a'b", 'a"b', "ü", "a=b", "x" * 129],
)
def test_bad_source_is_rejected(tmp_path: Path, source: str) -> None:
    with pytest.raises(InvalidPartitionError):
        Warehouse(tmp_path).write_partition("amplified", DS, source, amplified(1))
    assert list(tmp_path.iterdir()) == []


def test_unknown_table_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(InvalidPartitionError, match="unknown table"):
        Warehouse(tmp_path).write_partition("prompts", DS, "demo", [])
    with pytest.raises(InvalidIdentifierError):
        Warehouse(tmp_path).write_partition("../amplified", DS, "demo", [])
    assert list(tmp_path.iterdir()) == []
