"""The warehouse: the output tables as Apache Iceberg tables (pyiceberg), partitioned by identity
`ds`, `source`, their catalog in the ledger's state database.

- the catalog (`CatalogSpec`, `open_catalog`): pyiceberg's SQL catalog beside the partition
  leases, a write's lease confirmed inside the catalog commit's own transaction (`commit_fenced`);
- the partition overwrite (`replace_partition`): a partition replaced by one OVERWRITE snapshot,
  a commit's cost flat as snapshots accumulate;
- the tables (`Warehouse`, `open_warehouse`): a partition replaced by one catalog commit, read as
  of the current state or of the snapshots a warehouse is pinned to (`pinned`: what
  `kimi-batch export --as-of` reads).
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, date, datetime
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar

import polars as pl
import pyarrow as pa
from pydantic import BaseModel, ConfigDict, SecretStr
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError, TableAlreadyExistsError
from pyiceberg.expressions import AlwaysTrue, And, BooleanExpression, EqualTo
from pyiceberg.io.pyarrow import _check_pyarrow_schema_compatible, _dataframe_to_data_files
from pyiceberg.manifest import ManifestContent, ManifestFile
from pyiceberg.table import Table, TableProperties, Transaction
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Operation
from pyiceberg.table.update import update_table_metadata
from pyiceberg.table.update.snapshot import _ManifestMergeManager, _OverwriteFiles
from pyiceberg.utils.properties import property_as_bool
from sqlalchemy import URL, event
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from kimi_batch.crash_points import crash_point
from kimi_batch.paths import StatePaths, connect_private_db, database_server, private_dir
from kimi_batch.settings import Settings
from kimi_batch.state import Fence, SqliteDatabase, StateDatabase
from kimi_batch.storage import StorageError
from kimi_batch.warehouse.schema import (
    CATALOG_NAME,
    LEDGER_SCHEMA,
    PARTITION_COLUMNS,
    TABLES,
    model_for,
    polars_schema,
    validate_ds,
    validate_source,
)

# ---- the catalog --------------------------------------------------------------------------------

# The catalog lives where the partition leases live (the ledger's SQLite file by default, the
# `kimi_ledger` schema of `KIMI_BATCH_DATABASE_URL` for a team), so a partition write's lease is
# confirmed inside the catalog commit's own transaction: `commit_fenced` hands the commit's
# connection to the lease (`Fence.confirm_in`) just before the metadata swap commits. A writer
# whose lease ran out, even between its last check and the swap, commits nothing. Trino's Iceberg
# connector reads the same catalog through JDBC (`scripts/trino.sh`).

# Writers that may race on one table's metadata swap: pyiceberg retries a lost compare-and-swap
# this many times (each retry re-reads the table and re-applies the partition's overwrite).
COMMIT_RETRIES = 32


class CatalogSpec(BaseModel):
    """Where the catalog and the table files are."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    database: SecretStr  # the SQLAlchemy URL (a PostgreSQL one may hold a password)
    sqlite_path: Path | None = None
    warehouse: str  # the root URL of the table files: file:///... or s3://bucket/prefix
    namespace: str
    s3_endpoint: str | None = None
    s3_region: str | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> CatalogSpec:
        return cls.from_paths(
            settings.paths,
            namespace=settings.trino_schema,
            s3_endpoint=settings.s3_endpoint,
            s3_region=settings.s3_region,
        )

    @classmethod
    def from_paths(
        cls,
        paths: StatePaths,
        *,
        namespace: str = "kimi_batch",
        s3_endpoint: str | None = None,
        s3_region: str | None = None,
    ) -> CatalogSpec:
        """The catalog in the ledger's database of the state `paths`, the files in its
        warehouse (folder or URL)."""
        root = paths.warehouse_root
        if paths.database_url is None:
            path = paths.ledger_path.expanduser().resolve()
            # A generous busy timeout: commits of several workers queue on SQLite's write lock.
            # Built, not formatted: a '?' in a folder's name would end the path there.
            url = URL.create("sqlite", database=str(path), query={"timeout": "60"})
            database, sqlite_path = url.render_as_string(hide_password=False), path
        else:
            database, sqlite_path = _sqlalchemy_postgres(paths.database_url), None
        return cls(
            database=SecretStr(database),
            sqlite_path=sqlite_path,
            warehouse=root.rstrip("/"),
            namespace=namespace,
            s3_endpoint=s3_endpoint,
            s3_region=s3_region,
        )

    @classmethod
    def for_folder(cls, folder: Path, *, namespace: str = "kimi_batch") -> CatalogSpec:
        """A folder warehouse in the state dir's layout: the catalog in `../ledger/`."""
        folder = folder.expanduser().resolve()
        paths = StatePaths(home=folder.parent, warehouse_override=folder)
        return cls.from_paths(paths, namespace=namespace)

    def properties(self) -> dict[str, str]:
        """pyiceberg's catalog properties (the AWS variables give S3 credentials)."""
        properties = {"uri": self.database.get_secret_value(), "warehouse": self.warehouse}
        if self.s3_endpoint:
            properties["s3.endpoint"] = self.s3_endpoint
            properties["s3.force-virtual-addressing"] = "false"
        if self.s3_region:
            properties["s3.region"] = self.s3_region
        return properties


def _sqlalchemy_postgres(url: str) -> str:
    """`postgresql://...` as SQLAlchemy's psycopg 3 URL, on the ledger's schema (after the
    URL's own `options`, which a second `options` parameter would not add to)."""
    server = database_server(url)
    options = " ".join(o for o in (server.params.get("options"), _SEARCH_PATH) if o)
    return URL.create(
        "postgresql+psycopg",
        username=server.user,
        password=server.password.get_secret_value() if server.password else None,
        host=server.host,
        port=server.port,
        database=server.dbname,
        query={**server.params, "options": options},
    ).render_as_string(hide_password=False)


_SEARCH_PATH = f"-csearch_path={LEDGER_SCHEMA}"


_catalogs_lock = threading.Lock()


@lru_cache(maxsize=8)
def _catalog(spec: CatalogSpec) -> SqlCatalog:
    if spec.sqlite_path is None:
        _create_schema(spec)
    elif not spec.sqlite_path.exists():
        # The ledger's file, created owner-only and in WAL mode as the ledger creates it.
        private_dir(spec.sqlite_path.parent)
        connect_private_db(spec.sqlite_path).close()
    # Creates its own tables (iceberg_tables, iceberg_namespace_properties) if missing; the
    # namespace comes with the first table.
    return SqlCatalog(CATALOG_NAME, **spec.properties())


def _create_schema(spec: CatalogSpec) -> None:
    from sqlalchemy import create_engine, text

    engine = create_engine(spec.database.get_secret_value())
    try:
        with engine.begin() as connection:
            connection.execute(text(f"CREATE SCHEMA IF NOT EXISTS {LEDGER_SCHEMA}"))
    finally:
        engine.dispose()


def open_catalog(spec: CatalogSpec) -> SqlCatalog:
    """The catalog of `spec`, its tables created if missing (one per process and spec: it
    holds a connection pool)."""
    with _catalogs_lock:
        return _catalog(spec)  # pyright: ignore[reportArgumentType] - frozen: hashable


# The fence of the commit this thread is making (None: a commit that needs none).
_FENCE: ContextVar[tuple[Fence, CatalogSpec] | None] = ContextVar("_FENCE", default=None)


@contextmanager
def commit_fenced(fence: Fence | None, spec: CatalogSpec) -> Iterator[None]:
    """Catalog commits made inside confirm `fence` in their own transaction."""
    token = _FENCE.set(None if fence is None else (fence, spec))
    try:
        yield
    finally:
        _FENCE.reset(token)


def _state_database(session: Session, spec: CatalogSpec) -> StateDatabase:
    """The session's connection, inside its transaction, as a `StateDatabase`."""
    raw: Any = session.connection().connection.dbapi_connection
    if spec.sqlite_path is not None:
        return SqliteDatabase.wrap(raw, spec.sqlite_path)
    from kimi_batch.state import PostgresDatabase

    return PostgresDatabase.wrap(raw, spec.database.get_secret_value(), LEDGER_SCHEMA)


@event.listens_for(Session, "before_commit")
def _confirm_lease(session: Session) -> None:
    """pyiceberg's catalog commit is one session: its metadata swap is executed, not yet
    committed, when this runs; the lease is confirmed in the same transaction, or the commit
    raises and the swap is rolled back."""
    fenced = _FENCE.get()
    if fenced is None:
        return
    fence, spec = fenced
    fence.confirm_in(_state_database(session, spec))


# ---- the partition overwrite --------------------------------------------------------------------

# pyiceberg 0.12's `Table.overwrite` makes two snapshots a commit (a DELETE, then an APPEND),
# merges manifests only on appends (its overwrite carries a manifest of deleted entries into every
# later snapshot), and recomputes the table metadata dozens of times a commit
# (apache/iceberg-python #2673): a commit's cost followed the snapshots kept (5.8x night 1 after
# 30 simulated nights). `replace_partition` drives pyiceberg's own snapshot producer and merge
# manager the way Java's overwrite does. It reaches pyiceberg internals, pinned by the lock; the
# warehouse tests catch a change.


class _PartitionTransaction(Transaction):
    """pyiceberg's transaction with its table metadata computed once per change.

    pyiceberg 0.12 recomputes (deep-copies) the metadata with the transaction's updates on every
    access, dozens of times a commit, so a commit's cost grew with the snapshots kept
    (iceberg-python #2673; a cache like this one is upstream's fix, not yet released). The base
    metadata and the updates tuple are immutable and replaced, never changed, so the pair held
    by reference is the cache's key.
    """

    _computed: tuple[TableMetadata, tuple[Any, ...], TableMetadata] | None = None

    @property
    def table_metadata(self) -> TableMetadata:
        base, updates = self._table.metadata, self._updates
        computed = self._computed
        if computed is None or computed[0] is not base or computed[1] is not updates:
            computed = (base, updates, update_table_metadata(base, updates))
            self._computed = computed
        return computed[2]


class _MergingOverwrite(_OverwriteFiles):
    """pyiceberg's OVERWRITE snapshot producer, its manifests kept few as Java's overwrite does.

    pyiceberg 0.12 merges manifests only on appends, and its overwrite carries a manifest of
    only deleted entries into every later snapshot: with one overwrite a partition, a table's
    manifests grew by one or two a commit. Here a manifest naming no live file is dropped and
    the rest are merged by the table's `commit.manifest-merge.*` properties (pyiceberg's own
    merge manager), so a snapshot reads a bounded number of manifests.
    """

    def _existing_manifests(self) -> list[ManifestFile]:
        return [
            manifest
            for manifest in super()._existing_manifests()
            if manifest.has_added_files() or manifest.has_existing_files()
        ]

    def _build_manifest_evaluator(self, spec_id: int) -> Callable[[ManifestFile], bool]:
        """A fresh pyiceberg manifest evaluator for each manifest judged.

        pyiceberg 0.12's evaluator keeps the manifest it is judging on itself, and its overwrite
        shares one among the threads that read the parent snapshot's manifests for the files to
        delete: a thread switch mid-judgement read another manifest's partition summaries, so
        the manifest holding the files was skipped and pyiceberg refused the commit ("Missing
        required files to delete"; seen once under make test's load).
        """
        build = super()._build_manifest_evaluator
        return lambda manifest: build(spec_id)(manifest)

    def _process_manifests(self, manifests: list[ManifestFile]) -> list[ManifestFile]:
        properties = self._transaction.table_metadata.properties
        merge = _ManifestMergeManager(
            target_size_bytes=int(
                properties.get(
                    TableProperties.MANIFEST_TARGET_SIZE_BYTES,
                    TableProperties.MANIFEST_TARGET_SIZE_BYTES_DEFAULT,
                )
            ),
            min_count_to_merge=int(
                properties.get(
                    TableProperties.MANIFEST_MIN_MERGE_COUNT,
                    TableProperties.MANIFEST_MIN_MERGE_COUNT_DEFAULT,
                )
            ),
            merge_enabled=property_as_bool(
                properties,
                TableProperties.MANIFEST_MERGE_ENABLED,
                TableProperties.MANIFEST_MERGE_ENABLED_DEFAULT,
            ),
            snapshot_producer=self,
        )
        data = [manifest for manifest in manifests if manifest.content == ManifestContent.DATA]
        deletes = [manifest for manifest in manifests if manifest.content != ManifestContent.DATA]
        return merge.merge_manifests(data) + deletes


def replace_partition(iceberg: Table, data: pa.Table, partition: BooleanExpression) -> None:
    """The partition's files replaced by `data`'s in one OVERWRITE snapshot.

    pyiceberg's `overwrite` makes two snapshots (a DELETE, then an APPEND): twice the snapshots
    every later commit carries until they expire. Here the partition's current files are
    deleted and the new ones added by one snapshot producer; the partition filter scopes its
    conflict check, so a concurrent writer of another partition is retried, not refused.
    """
    transaction = _PartitionTransaction(iceberg)
    metadata = transaction.table_metadata
    _check_pyarrow_schema_compatible(
        metadata.schema(), provided_schema=data.schema, format_version=metadata.format_version
    )
    write_id = uuid.uuid4()
    added = (
        list(
            _dataframe_to_data_files(
                table_metadata=metadata, write_uuid=write_id, df=data, io=iceberg.io
            )
        )
        if data.num_rows
        else []
    )
    replaced = [task.file for task in iceberg.scan(row_filter=partition).plan_files()]
    if not added and not replaced:
        return  # an empty partition replaced by nothing: no commit
    operation = Operation.OVERWRITE if metadata.current_snapshot() else Operation.APPEND
    with _MergingOverwrite(operation, transaction, iceberg.io, commit_uuid=write_id) as overwrite:
        overwrite.delete_by_predicate(partition)
        for data_file in replaced:
            overwrite.delete_data_file(data_file)
        for data_file in added:
            overwrite.append_data_file(data_file)
    transaction.commit_transaction()


# ---- the tables ---------------------------------------------------------------------------------

# A partition is replaced by one catalog commit: an overwrite whose filter is the partition (the
# old files deleted and the new appended in one metadata swap), so a reader sees the old rows or
# the new, never a mix, and zero rows replace the partition with nothing. Files of replaced
# snapshots stay until the snapshot expires (`maintenance`): a query planned on the old snapshot
# finishes. A partition lease is confirmed inside the commit's own transaction (the catalog above).

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


_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


class _UnstorableError(ValueError):
    """A value a row model accepts that no column of its table can hold; `path` is its field's,
    filled in on the way out (built only for the error: `_stored` walks every value written)."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why
        self.path: list[str] = []

    def __str__(self) -> str:
        return f"{''.join(self.path).removeprefix('.')} {self.why}"


def _stored(value: Any) -> Any:
    """`value` as the tables store it: aware datetimes as naive UTC, recursively.

    A value no column holds is `_UnstorableError`: polars raises its own error for one at a
    row's top (an integer past 64 bits, a lone surrogate) and writes one nested in a struct as
    null, and a zoned time UTC cannot hold overflows `astimezone`.
    """
    if isinstance(value, datetime):
        if value.tzinfo is None:
            return value
        try:
            return value.astimezone(UTC).replace(tzinfo=None)
        except OverflowError as error:
            raise _UnstorableError(f"{value!r:.80} is outside the UTC range") from error
    if isinstance(value, int) and not _INT64_MIN <= value <= _INT64_MAX:
        raise _UnstorableError(f"{value} does not fit a 64-bit integer")
    if isinstance(value, str) and not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError as error:
            where = f"a lone surrogate at character {error.start}"
            raise _UnstorableError(f"holds {where}, not UTF-8 text") from error
    if isinstance(value, Mapping):
        stored: dict[Any, Any] = {}
        for key, item in value.items():
            try:
                stored[key] = _stored(item)
            except _UnstorableError as error:
                error.path.insert(0, f".{key}")
                raise
        return stored
    if isinstance(value, list):
        items: list[Any] = []
        for index, item in enumerate(value):
            try:
                items.append(_stored(item))
            except _UnstorableError as error:
                error.path.insert(0, f"[{index}]")
                raise
        return items
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

    for index, row in enumerate(rows, start=1):
        if not isinstance(row, model):
            raise TypeError(f"{table} takes {model.__name__} rows, got {type(row).__name__}")
        try:
            records.append(_stored(row.model_dump()))
        except _UnstorableError as error:
            # A KimiBatchError: the driver skips this partition and lands the others.
            raise StorageError(
                f"{table} row {index} cannot be stored, the partition is left as it was: {error}"
            ) from error
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
        # As pyiceberg reads the URL: its path as written (`StatePaths.warehouse_root`).
        return root.removeprefix("file://")

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
