"""The warehouse on an object store: `KIMI_BATCH_WAREHOUSE=s3://bucket/prefix` (S3 or any
S3-compatible server, `KIMI_BATCH_S3_ENDPOINT`).

The same contract as the local `Warehouse` (Hive layout, one file a partition, a rewrite replaces
it whole, a lost lease writes nothing) without a rename: a partition's file is built in the state
dir's `staging/`, uploaded under a prefix of its own (`<table>/ds=D/source=S/<version>/`), and the
partition's pointer switched to it in the ledger's store (`versions`), in the transaction where
the writer's lease is confirmed. Readers look the pointer up, then read that version: the old
rows or the new, never a mix. Superseded and abandoned versions are deleted by later writes once
their grace period is over (a reader, or a Trino query, may still hold the old one).

The client is pyarrow's S3 file system. Credentials come from the AWS SDK's chain (environment,
profile, instance role), never from a setting: nothing secret is logged or on a command line.
"""

from __future__ import annotations

import logging
import shutil
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, date, datetime
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

import polars as pl
import pyarrow.fs as pafs
from pydantic import BaseModel

from kimi_batch.paths import StateLocation, StatePaths, private_dir
from kimi_batch.state import Fence, StateDatabase, connect_state
from kimi_batch.storage.exceptions import ObjectStoreError, StorageError
from kimi_batch.storage.parquet import (
    PART_FILE,
    PartitionWrite,
    Warehouse,
    build_partition_file,
    validate_ds,
    validate_source,
)
from kimi_batch.storage.private_files import remove_stale_temps
from kimi_batch.storage.schema import model_for
from kimi_batch.storage.versions import CurrentVersion, PartitionVersions, version_prefix

__all__ = [
    "ABANDONED_AFTER_S",
    "RETIRED_GRACE_S",
    "ObjectWarehouse",
    "s3_filesystem",
    "warehouse_at",
]

logger = logging.getLogger(__name__)

# How long a superseded version stays readable: a reader that looked the pointer up just before
# the switch, or a Trino query planned on the old location, finishes within it.
RETIRED_GRACE_S = 900.0
# A version whose writer has not switched to it after this long was abandoned (killed mid-upload).
ABANDONED_AFTER_S = 6 * 3600.0
_SWEEP_LIMIT = 100
_COPY_BUFFER = 8 * 1024 * 1024


def s3_filesystem(*, endpoint: str | None, region: str | None) -> pafs.S3FileSystem:
    """pyarrow's S3 client for `endpoint` (None: AWS) with path-style addressing, which every
    S3-compatible server answers; credentials from the AWS chain."""
    options: dict[str, Any] = {"connect_timeout": 10.0, "request_timeout": 60.0}
    if endpoint is not None:
        parts = urlsplit(endpoint)
        options.update(endpoint_override=parts.netloc, scheme=parts.scheme)
    if region is not None:
        options["region"] = region
    return pafs.S3FileSystem(**options)


def _new_version() -> str:
    """A version name: sortable by time, unique across writers."""
    return f"v{datetime.now(UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:12]}"


class ObjectWarehouse(Warehouse):
    """The output tables' Parquet files under an s3:// prefix, versioned, with pointers."""

    versioned = True

    def __init__(
        self,
        url: str,
        *,
        filesystem: pafs.FileSystem,
        pointers: StateLocation,
        staging: Path,
        grace_s: float = RETIRED_GRACE_S,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme != "s3" or not parts.netloc:
            raise StorageError(f"not an s3:// warehouse URL: {url!r}")
        self.url = url.rstrip("/")
        self._base = self.url.removeprefix("s3://")  # bucket/prefix: pyarrow's names
        self.filesystem = filesystem
        self.pointers = pointers
        self.versions = PartitionVersions(pointers)
        self.staging = staging
        self.grace_s = grace_s
        self._created = False

    @property
    def location(self) -> str:
        return self.url

    def _no_files(self) -> StorageError:
        return StorageError(f"{self.url} is an object store: it has no local partition files")

    def table_dir(self, table: str) -> Path:
        raise self._no_files()

    def partition_dir(self, table: str, ds: str | date, source: str) -> Path:
        raise self._no_files()

    def partition_file(self, table: str, ds: str | date, source: str) -> Path:
        raise self._no_files()

    # -- writing --------------------------------------------------------------------------------

    def write_partition(
        self,
        table: str,
        ds: str | date,
        source: str,
        rows: Iterable[BaseModel],
        *,
        guard: Fence | None = None,
    ) -> PartitionWrite:
        """Upload a new version of the partition, then switch its pointer to it (under the
        lease's fence: LeaseLostError and the partition as it was, when the lease is lost)."""
        model_for(table)
        partition = (table, validate_ds(ds), validate_source(source))
        if guard is not None and guard.location != self.pointers:
            raise StorageError(
                "the partition's lease is kept in another store than the warehouse's pointers; "
                "both live in the ledger's (KIMI_BATCH_DATABASE_URL or the state dir)"
            )
        self._create()
        current, prefix = self._upload(partition, rows)
        try:
            self._switch(partition, current, guard)
        except BaseException:
            self._delete(prefix)  # this writer's version: nobody else reads it
            raise
        self.sweep()
        return PartitionWrite(
            table=table,
            ds=partition[1],
            source=partition[2],
            location=f"{self.url}/{prefix}/{PART_FILE}",
            rows=current.rows,
            bytes=current.bytes,
        )

    def _create(self) -> None:
        if not self._created:
            self.versions.create()
            self._created = True

    def _upload(
        self, partition: tuple[str, str, str], rows: Iterable[BaseModel]
    ) -> tuple[CurrentVersion, str]:
        """The rows built into a staged file and uploaded as a new version; (it, its prefix)."""
        staging = private_dir(self.staging)
        remove_stale_temps(staging)  # those of a writer killed mid-build (named by pid)
        built = build_partition_file(partition[0], rows, staging)
        try:
            current = CurrentVersion(
                version=_new_version(),
                rows=pl.scan_parquet(built).select(pl.len()).collect().item(),
                bytes=built.stat().st_size,
            )
            prefix = version_prefix(*partition, current.version)
            self.versions.expect(prefix, within_s=ABANDONED_AFTER_S)
            try:
                with self._errors("upload"), built.open("rb") as local:
                    key = f"{self._base}/{prefix}/{PART_FILE}"
                    with self.filesystem.open_output_stream(key) as remote:
                        shutil.copyfileobj(local, remote, _COPY_BUFFER)
            except BaseException:
                self._delete(prefix)
                raise
        finally:
            built.unlink(missing_ok=True)
        return current, prefix

    def _switch(
        self, partition: tuple[str, str, str], current: CurrentVersion, guard: Fence | None
    ) -> None:
        with guard.fenced() if guard is not None else self._transaction() as db:
            self.versions.switch(db, partition, current, grace_s=self.grace_s)

    @contextmanager
    def _transaction(self) -> Iterator[StateDatabase]:
        """A write without a lease (a tool, a test): the pointer store's own transaction."""
        with connect_state(self.pointers) as db, db.transaction():
            yield db

    def sweep(self) -> list[str]:
        """Delete the versions whose grace period is over; returns their prefixes."""
        deleted = [
            prefix for prefix in self.versions.due(limit=_SWEEP_LIMIT) if self._delete(prefix)
        ]
        return deleted

    def _delete(self, prefix: str) -> bool:
        """Delete a version's objects and forget it; False (left for a later sweep) on failure."""
        try:
            self.filesystem.delete_dir(f"{self._base}/{prefix}")
        except FileNotFoundError:
            pass
        except OSError as error:
            logger.warning("could not delete %s/%s (retried later): %s", self.url, prefix, error)
            return False
        self.versions.forget(prefix)
        return True

    @contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        try:
            yield
        except FileNotFoundError:
            raise
        except OSError as error:
            first = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
            raise ObjectStoreError(f"object store {self.url}: {doing} failed: {first}") from error

    # -- reading --------------------------------------------------------------------------------

    def partitions(self, table: str) -> list[tuple[str, str]]:
        model_for(table)
        return self.versions.partitions(table)

    def has_partition(self, table: str, ds: str | date, source: str) -> bool:
        return self.current_prefix(table, ds, source) is not None

    def current_prefix(self, table: str, ds: str | date, source: str) -> str | None:
        ds, source = validate_ds(ds), validate_source(source)
        model_for(table)
        current = self.versions.current(table, ds, source)
        return None if current is None else version_prefix(table, ds, source, current.version)

    @contextmanager
    def _opened(self, key: str) -> Iterator[IO[bytes]]:
        with self._errors("read"), self.filesystem.open_input_file(key) as handle:
            yield handle  # type: ignore[misc] - a NativeFile reads as a binary file

    def _read_file(self, table: str, ds: str, source: str) -> pl.DataFrame | None:
        prefix = self.current_prefix(table, ds, source)
        if prefix is None:
            return None
        with self._opened(f"{self._base}/{prefix}/{PART_FILE}") as handle:
            return pl.read_parquet(handle)

    def read_schema(self, written: PartitionWrite) -> dict[str, pl.DataType]:
        with self._opened(written.location.removeprefix("s3://")) as handle:
            return dict(pl.read_parquet_schema(handle))

    def count(self, table: str) -> int:
        """Rows of every current version (counted when each was written)."""
        model_for(table)
        return self.versions.rows(table)


def warehouse_at(paths: StatePaths) -> Warehouse:
    """The warehouse the settings name: the local folder, or the s3:// prefix (its pointers in
    the ledger's store, its partitions built in the state dir's `staging/`)."""
    if paths.warehouse_url is None:
        return Warehouse(paths.warehouse_dir)
    return ObjectWarehouse(
        paths.warehouse_url,
        filesystem=s3_filesystem(endpoint=paths.s3_endpoint, region=paths.s3_region),
        pointers=paths.ledger_state,
        staging=paths.staging_dir,
    )
