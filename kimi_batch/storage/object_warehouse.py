"""The warehouse on an object store (`s3://bucket/prefix`, S3 or an S3-compatible server).

The local `Warehouse`'s contract (Hive layout, one file a partition, a rewrite replaces it whole,
a writer that lost its lease writes nothing) without a rename: a partition's file is built in a
local staging folder, uploaded under a prefix of its own (`<table>/ds=D/source=S/<version>/`),
and the partition's pointer (`versions`, in the ledger's store) is switched to it inside the
writer's fence. Readers look the pointer up, then read that version: the old rows or the new,
never a mix. Replaced and abandoned versions are deleted by later writes once their grace period
is over (a reader, or a Trino query, may still be reading the old one).

Credentials come from the AWS variables (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, a
profile), read by the clients themselves: nothing secret is in a setting, a log line or argv.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import polars as pl
import pyarrow.fs as pafs
from pydantic import BaseModel

from kimi_batch.crash_points import crash_point
from kimi_batch.engine import LeaseLostError
from kimi_batch.paths import StateLocation, private_dir
from kimi_batch.settings import Settings
from kimi_batch.state import Fence
from kimi_batch.storage.exceptions import StorageError
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

__all__ = ["ABANDONED_AFTER_S", "RETIRED_GRACE_S", "ObjectWarehouse", "open_warehouse"]

logger = logging.getLogger(__name__)

# How long a replaced version stays readable: a reader that looked the pointer up just before the
# switch, or a Trino query planned on the old location, finishes within it.
RETIRED_GRACE_S = 900.0
# A version its writer has not switched to after this long was abandoned (killed mid-upload).
ABANDONED_AFTER_S = 6 * 3600.0
_SWEEP_LIMIT = 100


def open_warehouse(settings: Settings) -> Warehouse:
    """The deployment's warehouse (`KIMI_BATCH_WAREHOUSE`): the folder, or the object store
    (built in the local warehouse folder, its pointers beside the partition leases)."""
    paths = settings.paths
    if paths.warehouse_url is None:
        return Warehouse(paths.warehouse_dir)
    return ObjectWarehouse(
        paths.warehouse_url,
        endpoint=settings.s3_endpoint,
        region=settings.s3_region,
        pointers=paths.ledger_state,
        staging=paths.warehouse_dir,
    )


def _new_version() -> str:
    """A version name: sortable by time, unique across writers."""
    return f"v{datetime.now(UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:12]}"


class ObjectWarehouse(Warehouse):
    """The output tables' Parquet files under an s3:// prefix: versions, and a pointer each."""

    def __init__(
        self,
        url: str,
        *,
        endpoint: str | None,
        region: str | None,
        pointers: StateLocation,
        staging: Path,
        grace_s: float = RETIRED_GRACE_S,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme != "s3" or not parts.netloc:
            raise StorageError(f"not an s3:// warehouse URL: {url!r}")
        super().__init__(staging)  # the local folder partitions are built in
        self.url = url.rstrip("/")
        self._base = self.url.removeprefix("s3://")  # bucket/prefix, as pyarrow names objects
        self._endpoint, self._region = endpoint, region
        self.filesystem = _s3_filesystem(endpoint=endpoint, region=region)
        self.versions = PartitionVersions(pointers)
        self.grace_s = grace_s
        self._created = False

    def __repr__(self) -> str:
        return f"ObjectWarehouse({self.url!r})"

    def _no_files(self) -> StorageError:
        return StorageError(f"{self.url} is an object store: it has no local partition files")

    def table_dir(self, table: str) -> Path:
        raise self._no_files()

    def partition_dir(self, table: str, ds: str | date, source: str) -> Path:
        raise self._no_files()

    def write_partition(
        self,
        table: str,
        ds: str | date,
        source: str,
        rows: Iterable[BaseModel],
        *,
        guard: Fence | None = None,
    ) -> PartitionWrite:
        """Upload a new version of the partition, then switch its pointer to it inside `guard`'s
        fence (LeaseLostError, and the partition as it was, when the lease is lost)."""
        partition = (table, validate_ds(ds), validate_source(source))
        if not self._created:
            self.versions.create()
            self._created = True
        current, prefix = self._upload(partition, rows)
        try:
            self.versions.switch(guard, partition, current, grace_s=self.grace_s)
        except LeaseLostError:
            self._delete(prefix)  # refused before the switch: this writer's version, unread
            raise
        # Any other failure may come after the switch committed (an ambiguous COMMIT, a run
        # terminated at this moment): the pointer may name this version, so it is not deleted
        # here. Not switched to, it stays garbage (`expect`) and a later sweep deletes it.
        crash_point("warehouse.partition_committed")
        self.sweep()
        return PartitionWrite(
            table=table,
            ds=partition[1],
            source=partition[2],
            path=Path(prefix) / PART_FILE,
            url=f"{self.url}/{prefix}/{PART_FILE}",
            rows=current.rows,
            bytes=current.bytes,
        )

    def _upload(
        self, partition: tuple[str, str, str], rows: Iterable[BaseModel]
    ) -> tuple[CurrentVersion, str]:
        """The rows built into a staged file and uploaded as a new version; (it, its prefix)."""
        staging = private_dir(self.root)
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
                pafs.copy_files(
                    str(built),
                    f"{self._base}/{prefix}/{PART_FILE}",
                    source_filesystem=pafs.LocalFileSystem(),
                    destination_filesystem=self.filesystem,
                )
            except OSError as error:
                self._delete(prefix)
                raise StorageError(f"{self.url}: upload of {prefix} failed: {error}") from error
        finally:
            built.unlink(missing_ok=True)
        return current, prefix

    def sweep(self) -> list[str]:
        """Delete the versions whose grace period is over; returns their prefixes."""
        return [p for p in self.versions.due(limit=_SWEEP_LIMIT) if self._delete(p)]

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

    def partitions(self, table: str) -> list[tuple[str, str]]:
        model_for(table)
        return self.versions.partitions(table)

    def current_prefix(self, table: str, ds: str | date, source: str) -> str | None:
        """The current version's prefix under the warehouse (where Trino's partition points)."""
        ds, source = validate_ds(ds), validate_source(source)
        current = self.versions.current(table, ds, source)
        return None if current is None else version_prefix(table, ds, source, current.version)

    @property
    def location(self) -> str:
        return self.url

    def partition_location(self, table: str, ds: str | date, source: str) -> str | None:
        """The current version's prefix as a URL (None before the first write)."""
        prefix = self.current_prefix(table, ds, source)
        return None if prefix is None else f"{self.url}/{prefix}"

    def _file(self, table: str, ds: str, source: str) -> str | None:
        model_for(table)
        location = self.partition_location(table, ds, source)
        return None if location is None else f"{location}/{PART_FILE}"

    def _files(self, table: str) -> list[str]:
        return [
            f"{self.url}/{version_prefix(table, ds, source, current.version)}/{PART_FILE}"
            for ds, source in self.partitions(table)
            if (current := self.versions.current(table, ds, source)) is not None
        ]

    def _storage_options(self) -> dict[str, str]:
        options: dict[str, Any] = {}
        if self._endpoint is not None:
            options["aws_endpoint_url"] = self._endpoint
            options["aws_allow_http"] = str(self._endpoint.startswith("http://")).lower()
        if self._region is not None:
            options["aws_region"] = self._region
        return options


def _s3_filesystem(*, endpoint: str | None, region: str | None) -> pafs.S3FileSystem:
    """pyarrow's S3 client for `endpoint` (None: AWS), path-style (every S3-compatible server
    answers it); credentials from the AWS variables."""
    options: dict[str, Any] = {"connect_timeout": 10.0, "request_timeout": 60.0}
    if endpoint is not None:
        parts = urlsplit(endpoint)
        options.update(
            endpoint_override=parts.netloc, scheme=parts.scheme, force_virtual_addressing=False
        )
    if region is not None:
        options["region"] = region
    return pafs.S3FileSystem(**options)
