"""Parquet warehouse in Hive layout: `root/<table>/ds=YYYY-MM-DD/source=NAME/part-0.parquet`.

A partition is one file. Writing it again replaces it atomically (temp file in the same directory,
fsync, `os.replace`, fsync of the directory), so a re-materialization never appends and a reader
sees either the old or the new rows. The temp name starts with a dot, which Trino and Hive skip.
A partition lease (`guard`, a `Fence`) is confirmed in a transaction of its store around the
rename: a holder that stalled past its lease renames nothing over the run that took it over.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import nullcontext
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any, TypeVar

import polars as pl
from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.crash_points import crash_point
from kimi_batch.paths import PRIVATE_FILE_MODE, private_dir
from kimi_batch.state import Fence
from kimi_batch.storage.exceptions import InvalidPartitionError, StorageError
from kimi_batch.storage.private_files import remove_stale_temps
from kimi_batch.storage.schema import (
    PARTITION_COLUMNS,
    TABLES,
    model_for,
    polars_schema,
)

__all__ = [
    "PART_FILE",
    "PartitionWrite",
    "Warehouse",
    "build_partition_file",
    "validate_ds",
    "validate_source",
]

ModelT = TypeVar("ModelT", bound=BaseModel)

PART_FILE = "part-0.parquet"
# Rows held in memory at once while a partition is written.
CHUNK_ROWS = 2000
_DS = re.compile(r"^\d{4}-\d{2}-\d{2}$")
# First character alphanumeric: Hive and Trino skip paths that start with "." or "_".
_SOURCE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def validate_ds(ds: str | date) -> str:
    """`ds` as an ISO date string (YYYY-MM-DD); a `date` is accepted."""
    if isinstance(ds, datetime):
        raise InvalidPartitionError(f"ds must be a date, not a datetime: {ds!r}")
    if isinstance(ds, date):
        return ds.isoformat()
    if not isinstance(ds, str) or not _DS.fullmatch(ds):
        raise InvalidPartitionError(f"ds must be an ISO date YYYY-MM-DD, got {ds!r}")
    try:
        date.fromisoformat(ds)
    except ValueError as error:
        raise InvalidPartitionError(f"ds is not a valid date: {ds!r}") from error
    return ds


def validate_source(source: str) -> str:
    """`source` if it is 1-128 characters of [A-Za-z0-9_.-], starting alphanumeric."""
    if not isinstance(source, str) or not _SOURCE.fullmatch(source):
        raise InvalidPartitionError(
            f"source must be 1-128 characters of [A-Za-z0-9_.-] starting with a letter or digit, "
            f"got {source!r}"
        )
    return source


class PartitionWrite(BaseModel):
    """What `Warehouse.write_partition` wrote."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    table: str
    ds: str
    source: str
    path: Path = Field(
        description="The file written: absolute in a local warehouse; on an object store, its "
        "key under the warehouse's prefix (`url` is the whole object URL)."
    )
    rows: int
    bytes: int
    url: str | None = None

    @property
    def location(self) -> str:
        """The written file as a user names it: its URL, or its path."""
        return self.url or str(self.path)


def _utc_naive(value: Any) -> Any:
    """Aware datetimes -> naive UTC, recursively; the files store UTC without a zone."""
    if isinstance(value, datetime):
        return value.astimezone(UTC).replace(tzinfo=None) if value.tzinfo else value
    if isinstance(value, Mapping):
        return {key: _utc_naive(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_utc_naive(item) for item in value]
    return value


def _write_chunked(
    temp: Path, rows: Iterable[BaseModel], *, model: type[BaseModel], table: str, token: str
) -> None:
    """Write `rows` to `temp` (fsynced, owner-only) one chunk file at a time, then merge them."""
    schema = polars_schema(table)
    chunk_files: list[Path] = []
    try:
        for records in _chunks(rows, model, table):
            chunk = temp.parent / f".{PART_FILE}.{token}.{len(chunk_files)}.chunk"
            chunk_files.append(chunk)  # before the write: a failed write is cleaned up too
            pl.DataFrame(records, schema=schema).write_parquet(chunk, compression="zstd")
        if not chunk_files:
            pl.DataFrame(schema=schema).write_parquet(temp, compression="zstd", statistics=True)
        elif len(chunk_files) == 1:
            os.replace(chunk_files[0], temp)
        else:
            pl.scan_parquet(chunk_files).sink_parquet(temp, compression="zstd", statistics=True)
        with temp.open("rb") as handle:
            os.fsync(handle.fileno())
        os.chmod(temp, PRIVATE_FILE_MODE)
    finally:
        for chunk in chunk_files:
            chunk.unlink(missing_ok=True)


def build_partition_file(table: str, rows: Iterable[BaseModel], directory: Path) -> Path:
    """`rows` as one Parquet file in `directory` under a hidden temp name that carries this
    process's pid (`remove_stale_temps`); the caller moves it into place or deletes it."""
    model = model_for(table)
    token = f"{os.getpid()}-{uuid.uuid4().hex}"
    temp = directory / f".{PART_FILE}.{token}.tmp"
    try:
        _write_chunked(temp, rows, model=model, table=table, token=token)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return temp


def _chunks(
    rows: Iterable[BaseModel], model: type[BaseModel], table: str
) -> Iterator[list[dict[str, Any]]]:
    records: list[dict[str, Any]] = []
    for row in rows:
        if not isinstance(row, model):
            raise TypeError(f"{table} takes {model.__name__} rows, got {type(row).__name__}")
        records.append(_utc_naive(row.model_dump()))
        if len(records) >= CHUNK_ROWS:
            yield records
            records = []
    if records:
        yield records


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Warehouse:
    """The Parquet files of the output tables under one root directory."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root).expanduser().resolve()

    def __repr__(self) -> str:
        return f"Warehouse({str(self.root)!r})"

    def table_dir(self, table: str) -> Path:
        model_for(table)
        return self.root / table

    def partition_dir(self, table: str, ds: str | date, source: str) -> Path:
        return self.table_dir(table) / f"ds={validate_ds(ds)}" / f"source={validate_source(source)}"

    def partition_file(self, table: str, ds: str | date, source: str) -> Path:
        return self.partition_dir(table, ds, source) / PART_FILE

    def write_partition(
        self,
        table: str,
        ds: str | date,
        source: str,
        rows: Iterable[BaseModel],
        *,
        guard: Fence | None = None,
    ) -> PartitionWrite:
        """Write (or atomically replace) one partition; zero rows still writes a schema-only file.

        `guard` (the partition's lease) is confirmed in a transaction of its store around the
        rename: when the lease is lost (LeaseLostError), the partition is left as it was, and
        nobody takes the lease over between the confirmation and the rename.

        `rows` is consumed in chunks of `CHUNK_ROWS` (pass a generator and memory stays bounded
        whatever the partition's size): each chunk is written to a hidden temp file, and several
        chunks are streamed into the one partition file by polars, which never holds them all.
        """
        ds, source = validate_ds(ds), validate_source(source)
        directory = self.partition_dir(table, ds, source)
        private_dir(self.root)  # generated text is confidential: the root is owner-only
        directory.mkdir(parents=True, exist_ok=True)
        target = directory / PART_FILE
        remove_stale_temps(directory)  # those of a writer killed mid-write (named by pid)
        temp = build_partition_file(table, rows, directory)
        try:
            with guard.fenced() if guard is not None else nullcontext():
                os.replace(temp, target)
        finally:
            temp.unlink(missing_ok=True)
        # Files of another writer (part-1.parquet, ...) would be read as extra rows of the partition.
        for stale in directory.glob("*.parquet"):
            if stale.name != PART_FILE:
                stale.unlink()
        _fsync_dir(directory)
        crash_point("warehouse.partition_committed")
        return PartitionWrite(
            table=table,
            ds=ds,
            source=source,
            path=target,
            rows=pl.scan_parquet(target).select(pl.len()).collect().item(),
            bytes=target.stat().st_size,
        )

    def partitions(self, table: str) -> list[tuple[str, str]]:
        """(ds, source) of every partition that has its file, sorted."""
        found: list[tuple[str, str]] = []
        table_dir = self.table_dir(table)
        if not table_dir.is_dir():
            return found
        for ds_dir in table_dir.glob("ds=*"):
            for source_dir in ds_dir.glob("source=*"):
                ds, source = (
                    ds_dir.name.removeprefix("ds="),
                    source_dir.name.removeprefix("source="),
                )
                if (
                    _DS.fullmatch(ds)
                    and _SOURCE.fullmatch(source)
                    and (source_dir / PART_FILE).is_file()
                ):
                    found.append((ds, source))
        return sorted(found)

    @property
    def location(self) -> str:
        """Where the warehouse is, as a user names it (its folder, or its URL)."""
        return str(self.root)

    def _file(self, table: str, ds: str, source: str) -> str | None:
        """The partition's current file as polars opens it; None when it was never written."""
        path = self.partition_file(table, ds, source)
        return str(path) if path.is_file() else None

    def has_partition(self, table: str, ds: str | date, source: str) -> bool:
        """Whether the partition was written (zero rows included)."""
        return self._file(table, validate_ds(ds), validate_source(source)) is not None

    def partition_schema(self, table: str, ds: str | date, source: str) -> dict[str, pl.DataType]:
        """The written file's column types, from its footer (StorageError if never written)."""
        ds, source = validate_ds(ds), validate_source(source)
        file = self._file(table, ds, source)
        if file is None:
            raise StorageError(f"{table} ds={ds} source={source} was never written")
        scan = pl.scan_parquet(file, storage_options=self._storage_options())
        return dict(scan.collect_schema())

    def partition_location(self, table: str, ds: str | date, source: str) -> str | None:
        """Where Trino finds the partition, when not at its Hive path under the table's
        location (None here: a folder warehouse writes every partition in place)."""
        return None

    def _read_file(self, table: str, ds: str, source: str) -> pl.DataFrame | None:
        """The partition's file as written, or None when it was never written."""
        file = self._file(table, ds, source)
        return (
            None if file is None else pl.read_parquet(file, storage_options=self._storage_options())
        )

    def read_partition(self, table: str, ds: str | date, source: str) -> pl.DataFrame:
        """The rows of one partition with `ds` and `source` columns; empty if never written."""
        ds, source = validate_ds(ds), validate_source(source)
        frame = self._read_file(table, ds, source)
        if frame is None:
            return pl.DataFrame(schema=polars_schema(table, partitions=True))
        schema = polars_schema(table)
        # select + cast: column order and dtypes follow the model even for older files; a column
        # added since (input_sha256) reads as null there.
        added = [name for name in schema.names() if name not in frame.columns]
        frame = frame.with_columns(pl.lit(None).alias(name) for name in added)
        frame = frame.select(schema.names()).cast(schema)
        return frame.with_columns(
            pl.lit(ds, dtype=pl.String).alias(PARTITION_COLUMNS[0]),
            pl.lit(source, dtype=pl.String).alias(PARTITION_COLUMNS[1]),
        )

    def read_rows(
        self, table: str, ds: str | date, source: str, model: type[ModelT]
    ) -> list[ModelT]:
        """One partition's rows as `model` (without `ds` and `source`); [] if never written."""
        frame = self.read_partition(table, ds, source).drop(PARTITION_COLUMNS)
        return [model.model_validate(row) for row in frame.iter_rows(named=True)]

    def read_table(self, table: str) -> pl.DataFrame:
        """Every partition of a table, with `ds` and `source`; an empty frame with the schema if none."""
        frames = [self.read_partition(table, ds, source) for ds, source in self.partitions(table)]
        if not frames:
            return pl.DataFrame(schema=polars_schema(table, partitions=True))
        return pl.concat(frames, how="vertical")

    def scan(self, table: str) -> pl.LazyFrame:
        """Every partition file of a table as one lazy frame in the table's schema (no
        `ds`/`source`; a column added since reads as null in older files): only what is selected
        is read."""
        schema = polars_schema(table)
        files = self._files(table)
        if not files:
            return pl.LazyFrame(schema=schema)
        return pl.scan_parquet(
            files,
            schema=schema,
            missing_columns="insert",
            extra_columns="ignore",
            # A struct field added since (a logprob's token id) reads as null in older files.
            cast_options=pl.ScanCastOptions(missing_struct_fields="insert"),
            storage_options=self._storage_options(),
        )

    def _files(self, table: str) -> list[str]:
        """Every current partition file of a table, as polars opens them."""
        return [str(self.partition_file(table, ds, s)) for ds, s in self.partitions(table)]

    def _storage_options(self) -> dict[str, str] | None:
        """What polars needs to open `_files` (None: local files)."""
        return None

    def count(self, table: str) -> int:
        """Rows in all partitions of a table (from the Parquet footers, no data read)."""
        return sum(
            pl.scan_parquet(file, storage_options=self._storage_options())
            .select(pl.len())
            .collect()
            .item()
            for file in self._files(table)
        )

    def tables(self) -> list[str]:
        """The output tables that have at least one partition."""
        return [table for table in TABLES if self.partitions(table)]
