"""The output tables as Apache Iceberg tables (pyiceberg), partitioned by identity `ds`, `source`.

A partition is replaced by one catalog commit: an overwrite whose filter is the partition (the
old files deleted and the new appended in one metadata swap), so a reader sees the old rows or
the new, never a mix, and zero rows replace the partition with nothing. Files of replaced
snapshots stay until the snapshot expires (`maintenance`): a query planned on the old snapshot
finishes. A partition lease is confirmed inside the commit's own transaction (`catalog`).

A `Warehouse` reads the current state, or the snapshots it is pinned to (`pinned`): what
`kimi-batch export --as-of` reads.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit
from urllib.request import url2pathname

import polars as pl
import pyarrow as pa
from pydantic import BaseModel, ConfigDict
from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError, TableAlreadyExistsError
from pyiceberg.expressions import AlwaysTrue, And, BooleanExpression, EqualTo
from pyiceberg.table import Table
from sqlalchemy.exc import SQLAlchemyError

from kimi_batch.crash_points import crash_point
from kimi_batch.paths import private_dir
from kimi_batch.settings import Settings
from kimi_batch.state import Fence
from kimi_batch.storage import StorageError
from kimi_batch.warehouse.catalog import COMMIT_RETRIES, CatalogSpec, commit_fenced, open_catalog
from kimi_batch.warehouse.overwrite import replace_partition
from kimi_batch.warehouse.schema import (
    PARTITION_COLUMNS,
    TABLES,
    model_for,
    polars_schema,
    validate_ds,
    validate_source,
)

ModelT = TypeVar("ModelT", bound=BaseModel)

# Rows converted to Arrow at once while a partition is built.
CHUNK_ROWS = 2000
# Planning with pyiceberg is what this package wants; polars warns unless told so.
os.environ.setdefault("POLARS_ICEBERG_PLANNER", "pyiceberg")

TABLE_PROPERTIES = {
    "format-version": "2",
    "commit.retry.num-retries": str(COMMIT_RETRIES),
    "commit.retry.min-wait-ms": "20",
    "commit.retry.max-wait-ms": "2000",
    # Small commits, one a partition: merge manifests so planning reads a few, not one a night.
    "commit.manifest-merge.enabled": "true",
    "commit.manifest.min-count-to-merge": "20",
    # Old metadata files are deleted as commits go on; snapshots expire in `maintenance`.
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "20",
    "write.parquet.compression-codec": "zstd",
}


class PartitionWrite(BaseModel):
    """What `Warehouse.write_partition` committed."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    table: str
    ds: str
    source: str
    rows: int
    location: str  # the table's location (its metadata and data files are under it)
    snapshot_id: int  # the table's snapshot the commit made current


def _utc_naive(value: Any) -> Any:
    """Aware datetimes -> naive UTC, recursively; the tables store UTC without a zone."""
    if isinstance(value, datetime):
        return value.astimezone(UTC).replace(tzinfo=None) if value.tzinfo else value
    if isinstance(value, Mapping):
        return {key: _utc_naive(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_utc_naive(item) for item in value]
    return value


def _arrow_chunks(
    table: str, rows: Iterable[BaseModel], ds: str, source: str
) -> Iterator[pa.Table]:
    model, schema = model_for(table), polars_schema(table)
    records: list[dict[str, Any]] = []

    def chunk() -> pa.Table:
        frame = pl.DataFrame(records, schema=schema).with_columns(
            pl.lit(ds, dtype=pl.String).alias(PARTITION_COLUMNS[0]),
            pl.lit(source, dtype=pl.String).alias(PARTITION_COLUMNS[1]),
        )
        return frame.to_arrow()

    for row in rows:
        if not isinstance(row, model):
            raise TypeError(f"{table} takes {model.__name__} rows, got {type(row).__name__}")
        records.append(_utc_naive(row.model_dump()))
        if len(records) >= CHUNK_ROWS:
            yield chunk()
            records = []
    yield chunk()


def _field_paths(schema: pa.Schema) -> set[str]:
    """Every field's dotted path, nested ones too (a struct field inside a list included)."""

    def walk(prefix: str, kind: pa.DataType) -> Iterator[str]:
        if pa.types.is_struct(kind):
            for index in range(kind.num_fields):
                child = kind.field(index)
                yield f"{prefix}.{child.name}"
                yield from walk(f"{prefix}.{child.name}", child.type)
        elif pa.types.is_list(kind) or pa.types.is_large_list(kind):
            yield from walk(prefix, kind.value_type)

    paths: set[str] = set()
    for field in schema:
        paths.add(field.name)
        paths.update(walk(field.name, field.type))
    return paths


def _partition_filter(ds: str, source: str) -> BooleanExpression:
    return And(
        EqualTo(PARTITION_COLUMNS[0], ds),  # pyright: ignore[reportCallIssue]
        EqualTo(PARTITION_COLUMNS[1], source),  # pyright: ignore[reportCallIssue]
    )


class Warehouse:
    """The output tables in the deployment's Iceberg catalog (current, or pinned snapshots)."""

    def __init__(
        self, spec: CatalogSpec | Path | str, *, snapshots: Mapping[str, int] | None = None
    ) -> None:
        """`spec`: the catalog and files; a folder alone is a folder warehouse in the state
        dir's layout (its catalog in the ledger beside it: `<folder>/../ledger/`)."""
        self.spec = spec if isinstance(spec, CatalogSpec) else CatalogSpec.for_folder(Path(spec))
        self.snapshots: dict[str, int] | None = None if snapshots is None else dict(snapshots)

    def __repr__(self) -> str:
        return f"Warehouse({self.spec.warehouse!r})"

    @property
    def location(self) -> str:
        """Where the table files are, as a user names it (a folder, or an object-store URL)."""
        root = self.spec.warehouse
        return url2pathname(urlsplit(root).path) if root.startswith("file://") else root

    def pinned(self, snapshots: Mapping[str, int]) -> Warehouse:
        """The same tables as of `snapshots` (table -> snapshot id); a table not named reads
        as empty."""
        return Warehouse(self.spec, snapshots=snapshots)

    def identifier(self, table: str) -> str:
        model_for(table)  # an unknown table is refused
        return f"{self.spec.namespace}.{table}"

    def _load(self, table: str) -> Table | None:
        """The table, or None when it was never written (nothing is created by a read)."""
        path = self.spec.sqlite_path
        if path is not None and not path.exists():
            return None
        try:
            return open_catalog(self.spec).load_table(self.identifier(table))
        except (NoSuchTableError, NoSuchNamespaceError):
            return None
        except (SQLAlchemyError, OSError) as error:
            raise StorageError(f"the tables' catalog is unreadable: {error}") from error

    def iceberg_table(self, table: str) -> Table | None:
        """The pyiceberg table (None when never written): what maintenance works on."""
        return self._load(table)

    def _create(self, table: str, schema: pa.Schema) -> Table:
        catalog = open_catalog(self.spec)
        catalog.create_namespace_if_not_exists(self.spec.namespace)
        try:
            with (
                catalog.create_table_transaction(
                    self.identifier(table), schema=schema, properties=TABLE_PROPERTIES
                ) as created,
                created.update_spec() as spec,
            ):
                for column in PARTITION_COLUMNS:
                    spec.add_identity(column)
        except TableAlreadyExistsError:
            pass  # another writer created it first
        return catalog.load_table(self.identifier(table))

    def _writable(self, table: str, schema: pa.Schema) -> Table:
        """The table, created on first write; a column the row model gained since is added."""
        iceberg = self._load(table) or self._create(table, schema)
        if not _field_paths(schema) <= _field_paths(iceberg.schema().as_arrow()):
            with iceberg.update_schema() as update:
                update.union_by_name(schema)
            iceberg = open_catalog(self.spec).load_table(self.identifier(table))
        return iceberg

    def write_partition(
        self,
        table: str,
        ds: str | date,
        source: str,
        rows: Iterable[BaseModel],
        *,
        guard: Fence | None = None,
    ) -> PartitionWrite:
        """Replace one partition by `rows` in one commit (zero rows: the partition is emptied).

        `guard` (the partition's lease) is confirmed inside the catalog commit's transaction:
        when it is lost (LeaseLostError), the commit is rolled back and the table is as it was.
        """
        ds, source = validate_ds(ds), validate_source(source)
        data = pa.concat_tables(list(_arrow_chunks(table, rows, ds, source)))
        return self._commit(table, ds, source, data, guard)

    def write_frame(
        self, table: str, ds: str | date, source: str, frame: pl.DataFrame
    ) -> PartitionWrite:
        """Replace one partition by `frame`'s rows in one commit, as they are (no row model's
        round trip: what `migration` copies); a column of the table it lacks reads as null."""
        ds, source = validate_ds(ds), validate_source(source)
        schema = polars_schema(table)
        added = [name for name in schema.names() if name not in frame.columns]
        frame = frame.with_columns(pl.lit(None).alias(name) for name in added)
        frame = frame.select(schema.names()).cast(schema)
        data = frame.with_columns(
            pl.lit(ds, dtype=pl.String).alias(PARTITION_COLUMNS[0]),
            pl.lit(source, dtype=pl.String).alias(PARTITION_COLUMNS[1]),
        ).to_arrow()
        return self._commit(table, ds, source, data, None)

    def replace_quarantine(
        self,
        ds: str | date,
        source: str,
        stage: str,
        rows: Iterable[BaseModel],
        *,
        guard: Fence | None = None,
    ) -> int:
        """Replace `stage`'s quarantine rows of the partition, keeping the other stages' rows
        (the stages of a partition share its quarantine); the number written for `stage`.

        A read-modify-write of one partition: callers hold the partition's lease around it and
        pass it as `guard` (confirmed where the replace commits).
        """
        model = TABLES["quarantine"]
        frame = self.read_partition("quarantine", ds, source)
        kept = frame.filter(pl.col("stage") != stage).drop(list(PARTITION_COLUMNS))
        mine = list(rows)
        others = (model.model_validate(row) for row in kept.iter_rows(named=True))
        self.write_partition("quarantine", ds, source, [*others, *mine], guard=guard)
        crash_point("quarantine.rows_replaced")
        return len(mine)

    def _commit(
        self, table: str, ds: str, source: str, data: pa.Table, guard: Fence | None
    ) -> PartitionWrite:
        if self.snapshots is not None:
            raise StorageError("a warehouse pinned to snapshots is read-only")
        if self.spec.warehouse.startswith("file://"):
            # Generated text is confidential: the folder every table file is under is owner-only.
            private_dir(Path(self.location))
        iceberg = self._writable(table, data.schema)
        with commit_fenced(guard, self.spec):
            replace_partition(iceberg, data, _partition_filter(ds, source))
        crash_point("warehouse.partition_committed")
        snapshot = iceberg.current_snapshot()
        return PartitionWrite(
            table=table,
            ds=ds,
            source=source,
            rows=data.num_rows,
            location=iceberg.location(),
            snapshot_id=snapshot.snapshot_id if snapshot else 0,
        )

    def snapshot_id(self, table: str) -> int | None:
        """The table's snapshot read here (its current one unless pinned); None if none."""
        if self.snapshots is not None:
            return self.snapshots.get(table)
        iceberg = self._load(table)
        snapshot = iceberg.current_snapshot() if iceberg else None
        return snapshot.snapshot_id if snapshot else None

    def _read_state(self, table: str) -> tuple[Table, int] | None:
        """The table and the snapshot to read; None when there is nothing to read."""
        iceberg = self._load(table)
        snapshot = self.snapshot_id(table) if iceberg else None
        return None if iceberg is None or snapshot is None else (iceberg, snapshot)

    def partitions(self, table: str) -> list[tuple[str, str]]:
        """(ds, source) of every partition that holds rows, sorted."""
        state = self._read_state(table)
        if state is None:
            return []
        iceberg, snapshot = state
        found = iceberg.inspect.partitions(snapshot_id=snapshot).to_pylist()
        return sorted(
            (item["partition"][PARTITION_COLUMNS[0]], item["partition"][PARTITION_COLUMNS[1]])
            for item in found
            if item["record_count"] > 0
        )

    def has_partition(self, table: str, ds: str | date, source: str) -> bool:
        """Whether the partition holds rows."""
        return (validate_ds(ds), validate_source(source)) in self.partitions(table)

    def partition_schema(self, table: str, ds: str | date, source: str) -> dict[str, pl.DataType]:
        """The column types a partition of the table is read with."""
        validate_ds(ds)
        validate_source(source)
        return dict(polars_schema(table))

    def _arrow(self, table: str, row_filter: BooleanExpression | None = None) -> pa.Table | None:
        state = self._read_state(table)
        if state is None:
            return None
        iceberg, snapshot = state
        return iceberg.scan(row_filter=row_filter or AlwaysTrue(), snapshot_id=snapshot).to_arrow()

    def _frame(self, table: str, data: pa.Table | None) -> pl.DataFrame:
        """`data` in the table's schema with `ds` and `source` last (a column added since an
        older snapshot reads as null)."""
        schema = polars_schema(table, partitions=True)
        if data is None:
            return pl.DataFrame(schema=schema)
        frame = pl.from_arrow(data)
        assert isinstance(frame, pl.DataFrame)
        added = [name for name in schema.names() if name not in frame.columns]
        frame = frame.with_columns(pl.lit(None).alias(name) for name in added)
        return frame.select(schema.names()).cast(schema)

    def read_partition(self, table: str, ds: str | date, source: str) -> pl.DataFrame:
        """The rows of one partition with `ds` and `source` columns; empty if none."""
        ds, source = validate_ds(ds), validate_source(source)
        return self._frame(table, self._arrow(table, _partition_filter(ds, source)))

    def read_rows(
        self, table: str, ds: str | date, source: str, model: type[ModelT]
    ) -> list[ModelT]:
        """One partition's rows as `model` (without `ds` and `source`); [] if none."""
        frame = self.read_partition(table, ds, source).drop(PARTITION_COLUMNS)
        return [model.model_validate(row) for row in frame.iter_rows(named=True)]

    def read_table(self, table: str) -> pl.DataFrame:
        """Every partition of a table, with `ds` and `source`."""
        return self._frame(table, self._arrow(table))

    def scan(self, table: str) -> pl.LazyFrame:
        """The table as one lazy frame in its row model's schema (no `ds`/`source`): only what
        is selected is read."""
        schema = polars_schema(table)
        state = self._read_state(table)
        if state is None:
            return pl.LazyFrame(schema=schema)
        iceberg, snapshot = state
        lazy = pl.scan_iceberg(
            iceberg, snapshot_id=snapshot, storage_options=self._storage_options()
        )
        present = set(lazy.collect_schema().names())
        return lazy.select(
            pl.col(name) if name in present else pl.lit(None).alias(name) for name in schema.names()
        ).cast(schema)

    def _storage_options(self) -> dict[str, str] | None:
        """What polars needs to open an object store's files (credentials: the AWS variables)."""
        if not self.spec.warehouse.startswith("s3://"):
            return None
        options = {"aws_region": self.spec.s3_region or "us-east-1"}
        if self.spec.s3_endpoint:
            options["aws_endpoint_url"] = self.spec.s3_endpoint
            options["aws_allow_http"] = str(self.spec.s3_endpoint.startswith("http://")).lower()
        return options

    def count(self, table: str) -> int:
        """Rows in the table (from the snapshot's summary, no data read)."""
        state = self._read_state(table)
        if state is None:
            return 0
        iceberg, snapshot_id = state
        snapshot = iceberg.snapshot_by_id(snapshot_id)
        summary = snapshot.summary if snapshot else None
        total = summary.additional_properties.get("total-records") if summary else None
        return int(total) if total is not None else len(self.read_table(table))

    def tables(self) -> list[str]:
        """The output tables that hold at least one partition."""
        return [table for table in TABLES if self.partitions(table)]


def open_warehouse(settings: Settings) -> Warehouse:
    """The deployment's tables (`KIMI_BATCH_WAREHOUSE` for the files, the catalog in the
    ledger's state database)."""
    return Warehouse(CatalogSpec.from_settings(settings))
