"""The Iceberg tables: one commit a partition, explicit schema, validated partitions.

The tests of the storage contract run on both warehouse kinds (`warehouse_kind`: the local
folder, an s3:// prefix on the session's S3 server); the others test the local folder."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from datetime import UTC, date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any, TypeVar

import polars as pl
import pyarrow.parquet as pq
import pytest
from pyiceberg.expressions import visitors
from pyiceberg.manifest import ManifestFile
from pyiceberg.utils.concurrent import ExecutorFactory
from sqlalchemy import make_url

from kimi_batch.crash_points import CrashPointReached, armed
from kimi_batch.errors import ConfigError
from kimi_batch.paths import StatePaths
from kimi_batch.pipeline import DistilledRow
from kimi_batch.storage import InvalidIdentifierError, InvalidPartitionError
from kimi_batch.warehouse import TABLES, CatalogSpec, Warehouse, open_catalog, polars_schema
from kimi_batch_tests.support.rows import CREATED_AT, amplified, distilled, quarantined
from kimi_batch_tests.support.s3proxy import WarehouseFactory

# Its slow tests start no llama-server: they run beside the ones that do (support/slow_split.py).
pytestmark = pytest.mark.no_llama_server

DS = "2024-05-01"
T = TypeVar("T")


def test_a_partition_is_an_iceberg_commit_and_round_trips(tmp_path: Path) -> None:
    warehouse = Warehouse(tmp_path / "warehouse")
    rows = amplified(3)
    written = warehouse.write_partition("amplified", DS, "demo", rows)

    assert (written.rows, written.table, written.ds, written.source) == (3, "amplified", DS, "demo")
    table = open_catalog(warehouse.spec).load_table("kimi_batch.amplified")
    assert table.metadata.format_version == 2
    assert [field.name for field in table.spec().fields] == ["ds", "source"]
    assert [str(field.transform) for field in table.spec().fields] == ["identity", "identity"]
    assert written.snapshot_id == table.current_snapshot().snapshot_id  # type: ignore[union-attr]
    assert written.location == table.location()
    assert written.location.startswith((tmp_path / "warehouse").as_uri())
    frame = warehouse.read_partition("amplified", DS, "demo")
    assert frame.schema == polars_schema("amplified", partitions=True)
    assert frame["request_id"].to_list() == [row.request_id for row in rows]
    assert frame["ds"].unique().to_list() == [DS]
    assert frame["source"].unique().to_list() == ["demo"]
    # Stored as naive UTC with microseconds.
    assert frame["created_at"][0] == CREATED_AT.replace(tzinfo=None)


def test_the_catalog_is_in_the_ledger_s_database(tmp_path: Path) -> None:
    """Beside the leases: a lease is confirmed in the commit's own transaction."""
    Warehouse(tmp_path / "warehouse").write_partition("amplified", DS, "demo", amplified(1))
    with sqlite3.connect(tmp_path / "ledger" / "ledger.sqlite3") as db:
        rows = db.execute("SELECT table_namespace, table_name FROM iceberg_tables").fetchall()
    assert rows == [("kimi_batch", "amplified")]


@pytest.mark.parametrize("mark", ["#", "?"])
def test_a_warehouse_folder_whose_name_ends_a_file_location_is_refused(
    tmp_path: Path, mark: str
) -> None:
    """A '#' or '?' ends the path of a table file's location for pyiceberg and Trino alike:
    the tables would be written (and read) somewhere else."""
    with pytest.raises(ConfigError, match="holds a '#' or '\\?'"):
        Warehouse(tmp_path / f"run{mark}1" / "warehouse")
    assert list(tmp_path.iterdir()) == []


def test_the_catalog_of_a_state_folder_named_with_a_question_mark_is_in_its_ledger(
    tmp_path: Path,
) -> None:
    """With an object-store warehouse the state folder may hold a '?': the catalog's database
    URL is built, not formatted, so SQLAlchemy opens the ledger's own file."""
    paths = StatePaths(home=tmp_path / "run?1", warehouse_url="s3://bucket/tables")

    spec = CatalogSpec.from_paths(paths)

    assert make_url(spec.database.get_secret_value()).database == str(paths.ledger_path)


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
    """A table made before logprobs kept token ids (`id`) gains the nested field on the next
    write; its older rows read whole, by rows and by scan, their ids null."""
    warehouse = Warehouse(tmp_path / "warehouse")
    token = {"token": pl.String, "logprob": pl.Float64}
    old = pl.List(pl.Struct({**token, "top": pl.List(pl.Struct(token))}))
    frame = pl.DataFrame(
        [row.model_dump() for row in distilled(amplified(2))],
        schema=polars_schema("distilled"),
    )
    older = frame.with_columns(
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
        ),
        pl.lit(DS).alias("ds"),
        pl.lit("old").alias("source"),
    ).cast({"logprobs": old})
    catalog = open_catalog(warehouse.spec)
    catalog.create_namespace_if_not_exists("kimi_batch")
    catalog.create_table("kimi_batch.distilled", schema=older.to_arrow().schema).append(
        older.to_arrow()
    )

    warehouse.write_partition("distilled", DS, "demo", distilled(amplified(1)))
    (row, *_) = warehouse.read_rows("distilled", DS, "old", DistilledRow)
    assert row.logprobs is not None
    assert (row.logprobs[0].token, row.logprobs[0].id, row.logprobs[0].top[0].id) == (
        "Paris",
        None,
        None,
    )
    scanned = warehouse.scan("distilled").select("logprobs").collect()["logprobs"].to_list()
    assert len(scanned) == 3
    assert [item[0]["id"] for item in scanned] == [None, None, None]


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
    warehouse.write_partition("amplified", DS, "demo", [])  # zero rows: nothing to hold
    assert not warehouse.has_partition("amplified", DS, "demo")
    written = warehouse.write_partition("amplified", DS, "demo", amplified(1))
    assert warehouse.has_partition("amplified", DS, "demo")
    assert not warehouse.has_partition("amplified", DS, "other")
    assert warehouse.partition_schema("amplified", DS, "demo") == dict(polars_schema("amplified"))
    assert written.location.startswith(warehouse.spec.warehouse)


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


def test_a_partition_replaced_is_one_overwrite_snapshot_and_manifests_stay_few(
    tmp_path: Path,
) -> None:
    """One snapshot a write (not a DELETE and an APPEND), the other partitions' files kept, and
    however many replacements, the snapshot reads a bounded number of manifests."""
    warehouse = Warehouse(tmp_path / "warehouse")
    warehouse.write_partition("amplified", DS, "kept", amplified(3, prefix="kept"))
    for write in range(30):
        before = warehouse.iceberg_table("amplified")
        assert before is not None
        written = warehouse.write_partition("amplified", DS, "demo", amplified(2 + write % 3))
        after = warehouse.iceberg_table("amplified")
        assert after is not None
        assert len(after.metadata.snapshots) == len(before.metadata.snapshots) + 1
        snapshot = after.current_snapshot()
        assert snapshot is not None
        assert snapshot.snapshot_id == written.snapshot_id
        assert snapshot.summary is not None
        assert snapshot.summary.operation.value == "overwrite"
    assert warehouse.count("amplified") == 3 + 2 + 29 % 3
    assert warehouse.read_partition("amplified", DS, "kept").height == 3
    last = warehouse.iceberg_table("amplified")
    current = last.current_snapshot() if last else None
    assert last is not None
    assert current is not None
    assert len(current.manifests(last.io)) <= 20  # commit.manifest.min-count-to-merge
    # The partition emptied: its files deleted, the other partition's kept.
    warehouse.write_partition("amplified", DS, "demo", [])
    assert warehouse.partitions("amplified") == [(DS, "kept")]


def test_failed_write_keeps_old_partition(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    warehouse = Warehouse(tmp_path / "warehouse")
    warehouse.write_partition("amplified", DS, "demo", amplified(3))
    before = warehouse.snapshot_id("amplified")

    def broken_write(*_: object, **__: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(pq.ParquetWriter, "write_table", broken_write)
    with pytest.raises(OSError, match="disk full"):
        warehouse.write_partition("amplified", DS, "demo", amplified(7))
    monkeypatch.undo()

    assert warehouse.count("amplified") == 3
    assert warehouse.snapshot_id("amplified") == before


def test_wrong_row_type_is_rejected_before_writing(
    tmp_path: Path, warehouse_kind: WarehouseFactory
) -> None:
    warehouse = warehouse_kind(tmp_path)
    warehouse.write_partition("amplified", DS, "demo", amplified(1))
    with pytest.raises(TypeError, match="AmplifiedRow"):
        warehouse.write_partition("amplified", DS, "demo", quarantined(1))
    assert warehouse.count("amplified") == 1


def test_a_stray_parquet_file_in_the_table_folder_is_not_read(tmp_path: Path) -> None:
    """Readers go through the catalog: a file nobody committed (a glob's extra rows) is not a row."""
    warehouse = Warehouse(tmp_path / "warehouse")
    warehouse.write_partition("amplified", DS, "demo", amplified(2))
    data = tmp_path / "warehouse" / "kimi_batch" / "amplified" / "data"
    stray = next(data.rglob("*.parquet")).parent / "stray.parquet"
    warehouse.read_partition("amplified", DS, "demo").write_parquet(stray)
    warehouse.write_partition("amplified", DS, "demo", amplified(2))
    assert warehouse.count("amplified") == 2
    assert warehouse.read_table("amplified").height == 2


def test_an_empty_result_replaces_the_partition_with_nothing(tmp_path: Path) -> None:
    warehouse = Warehouse(tmp_path / "warehouse")
    warehouse.write_partition("quarantine", date(2024, 5, 2), "empty", quarantined(2))
    warehouse.write_partition("quarantine", date(2024, 5, 2), "kept", quarantined(1))
    written = warehouse.write_partition("quarantine", date(2024, 5, 2), "empty", [])

    assert written.rows == 0
    assert warehouse.partitions("quarantine") == [("2024-05-02", "kept")]
    assert warehouse.read_partition("quarantine", "2024-05-02", "empty").height == 0
    assert warehouse.count("quarantine") == 1


def test_an_empty_first_write_creates_the_table_with_its_schema(tmp_path: Path) -> None:
    warehouse = Warehouse(tmp_path / "warehouse")
    written = warehouse.write_partition("quarantine", date(2024, 5, 2), "empty", [])
    assert written.rows == 0
    assert warehouse.partitions("quarantine") == []
    frame = warehouse.read_table("quarantine")
    assert frame.height == 0
    assert frame.schema == polars_schema("quarantine", partitions=True)
    assert warehouse.count("quarantine") == 0


def test_null_only_columns_keep_their_types(tmp_path: Path) -> None:
    warehouse = Warehouse(tmp_path / "warehouse")
    rows = [
        row.model_copy(update={"strategy": None, "origin": "seed"})
        for row in distilled(amplified(3), with_logprobs=False)
    ]
    warehouse.write_partition("distilled", DS, "demo", rows)
    frame = warehouse.read_table("distilled")
    assert frame.schema == polars_schema("distilled", partitions=True)
    # pyiceberg writes a null list of structs as an empty one (apache/iceberg-python#3833, fix
    # open upstream): `logprobs` reads [] for "none", the same to every consumer.
    assert frame["logprobs"].to_list() == [[], [], []]
    assert frame["strategy"].null_count() == 3


def test_nothing_written_reads_empty(tmp_path: Path, warehouse_kind: WarehouseFactory) -> None:
    warehouse = warehouse_kind(tmp_path)
    for table in TABLES:
        assert warehouse.partitions(table) == []
        assert warehouse.count(table) == 0
        assert warehouse.read_table(table).schema == polars_schema(table, partitions=True)
    assert warehouse.read_partition("amplified", DS, "x").height == 0


def test_a_column_added_since_reads_as_null_in_older_rows(tmp_path: Path) -> None:
    """A table made before a column was added (`input_sha256`) gains it on the next write."""
    warehouse = Warehouse(tmp_path / "warehouse")
    older, newer = quarantined(2)
    warehouse.write_partition("quarantine", DS, "old", [older])
    table = open_catalog(warehouse.spec).load_table("kimi_batch.quarantine")
    with table.update_schema() as update:
        update.delete_column("input_sha256")
    warehouse.write_partition(
        "quarantine", DS, "new", [newer.model_copy(update={"input_sha256": "f" * 64})]
    )
    scanned = warehouse.scan("quarantine").select("reason", "input_sha256").collect()
    assert scanned.height == 2
    assert sorted(scanned["input_sha256"].to_list(), key=str) == [None, "f" * 64]
    assert warehouse.read_table("quarantine")["input_sha256"].null_count() == 1
    assert warehouse.scan("amplified").collect().schema == polars_schema("amplified")


def test_partitions_and_tables_listing(tmp_path: Path) -> None:
    warehouse = Warehouse(tmp_path / "warehouse")
    warehouse.write_partition("amplified", "2024-05-02", "b", amplified(1))
    warehouse.write_partition("amplified", "2024-05-01", "a.v2", amplified(2))
    warehouse.write_partition("amplified", "2024-05-01", "b", amplified(3))
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
        Warehouse(tmp_path / "warehouse").write_partition("amplified", ds, "demo", amplified(1))
    assert list(tmp_path.iterdir()) == []


def test_datetime_is_not_a_ds(tmp_path: Path) -> None:
    with pytest.raises(InvalidPartitionError):
        Warehouse(tmp_path / "warehouse").write_partition(
            "amplified", datetime.now(UTC), "demo", []
        )


@pytest.mark.parametrize(
    "source",
    ["", "a/b", "..", ".hidden", "_tmp", "x y", "x;y", "a'b", 'a"b', "ü", "a=b", "x" * 129],
)
def test_bad_source_is_rejected(tmp_path: Path, source: str) -> None:
    with pytest.raises(InvalidPartitionError):
        Warehouse(tmp_path / "warehouse").write_partition("amplified", DS, source, amplified(1))
    assert list(tmp_path.iterdir()) == []


def test_unknown_table_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(InvalidPartitionError, match="unknown table"):
        Warehouse(tmp_path / "warehouse").write_partition("prompts", DS, "demo", [])
    with pytest.raises(InvalidIdentifierError):
        Warehouse(tmp_path / "warehouse").write_partition("../amplified", DS, "demo", [])
    assert list(tmp_path.iterdir()) == []


class _ThreadPerTask(Executor):
    """Each task on a thread of its own: the worst a busy thread pool does."""

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()

        def run() -> None:
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as error:  # handed to the caller, as a pool's future does
                future.set_exception(error)

        threading.Thread(target=run, daemon=True).start()
        return future


def test_a_replace_judges_each_manifest_by_its_own_partitions_whatever_the_threads_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pyiceberg's overwrite reads the parent's manifests on several threads; its manifest
    evaluator kept the manifest being judged on itself, so a thread switch mid-judgement judged
    the replaced partition's manifest by another's partitions, and pyiceberg refused the
    commit (seen once under make test's load). Here the switch is forced: the other manifest's
    thread takes its partitions while the replaced one's is judging."""
    warehouse = Warehouse(tmp_path / "warehouse")
    warehouse.write_partition("amplified", DS, "other", amplified(2, prefix="other"))
    warehouse.write_partition("amplified", DS, "demo", amplified(3, prefix="old"))
    judging_demo, other_taken = threading.Event(), threading.Event()
    partitions, visit = ManifestFile.partitions, visitors.visit

    def on_a_worker() -> bool:  # the scan before judges the manifests on this thread, in turn
        return threading.current_thread() is not threading.main_thread()

    def holds(summaries: list[Any] | None, source: bytes) -> bool:
        return any(summary.lower_bound == source for summary in summaries or ())

    def take_partitions(manifest: ManifestFile) -> list[Any] | None:
        summaries = partitions.fget(manifest)  # pyright: ignore[reportOptionalCall]
        if on_a_worker() and holds(summaries, b"other"):
            judging_demo.wait(5)  # the other manifest's thread waits for the demo one to judge
        return summaries

    def judge(expression: Any, visitor: Any) -> Any:
        evaluator = visitors._ManifestEvalVisitor  # pyright: ignore[reportPrivateUsage]
        if isinstance(visitor, evaluator) and on_a_worker():
            if holds(visitor.partition_fields, b"demo"):
                judging_demo.set()
                other_taken.wait(2)  # ... and takes its partitions meanwhile
            else:
                other_taken.set()
        return visit(expression, visitor)

    monkeypatch.setattr(ManifestFile, "partitions", property(take_partitions))
    monkeypatch.setattr(visitors, "visit", judge)
    monkeypatch.setattr(ExecutorFactory, "get_or_create", lambda: _ThreadPerTask())
    warehouse.write_partition("amplified", DS, "demo", amplified(5, prefix="new"))
    assert judging_demo.is_set()  # the forced interleaving ran
    monkeypatch.undo()
    rows = warehouse.read_partition("amplified", DS, "demo")
    assert sorted(rows["request_id"].to_list()) == sorted(
        row.request_id for row in amplified(5, prefix="new")
    )
    assert warehouse.read_partition("amplified", DS, "other").height == 2
