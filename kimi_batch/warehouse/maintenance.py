"""Table maintenance: snapshot expiry, orphan-file removal, and what keeps the metadata bounded.

Every partition write is a commit, so a table gains snapshots every night; left alone, its
metadata file lists them all and its folders keep every replaced partition's files. Outside the
nightly window (`kimi_batch.defs.maintenance`, `kimi-batch warehouse maintain`), each table:

1. expires the snapshots older than the retention (KIMI_BATCH_SNAPSHOT_RETENTION_DAYS), never
   the current one nor one a tag or branch points at (the `night-YYYY-MM-DD` tags: a training
   set pinned to a night stays readable for as long as its tag lives). pyiceberg's expiry only
   rewrites the metadata: the files stay;
2. removes the orphan files: every file under the table's `data/` and `metadata/` that no
   remaining snapshot, manifest or metadata file names (the expired snapshots' files, files of a
   writer killed before its commit, metadata files past `write.metadata.previous-versions-max`)
   and that is older than `orphan_age` (a commit in flight has written files it does not name
   yet). pyiceberg has no orphan removal, and Trino's `remove_orphan_files` needs a Trino that is
   optional here, so it is done here, with pyiceberg's own file IO (a folder or s3://).

Manifests need no pass of their own: each partition commit merges them (`tables`, by the table's
`commit.manifest-merge.*` properties) once a snapshot has `commit.manifest.min-count-to-merge` of
them, so a snapshot names a bounded number of manifests however many nights went by (the report
counts them).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from pyarrow.fs import FileSelector, FileType
from pydantic import BaseModel, ConfigDict
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.table import Table
from sqlalchemy.exc import SQLAlchemyError

from kimi_batch.crash_points import crash_point
from kimi_batch.storage import StorageError
from kimi_batch.warehouse.schema import TABLES
from kimi_batch.warehouse.tables import Warehouse

logger = logging.getLogger(__name__)

# A file no metadata names yet may be a commit in flight: removed only once this old.
ORPHAN_AGE = timedelta(days=1)
# A writer's commit between this expiry's read and its swap makes the swap fail: read again.
_EXPIRY_ATTEMPTS = 5


class TableMaintenance(BaseModel):
    """What maintenance did to one table, and the table's metadata after it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    table: str
    snapshots_expired: int
    snapshots_kept: int
    files_removed: int
    bytes_removed: int
    manifests: int  # manifests the current snapshot reads
    metadata_bytes: int  # size of the current metadata file


def _expire(iceberg: Table, before: datetime) -> tuple[Table, int]:
    """Expire the unprotected snapshots older than `before`; (the table after, how many)."""
    for attempt in range(_EXPIRY_ATTEMPTS):
        protected = {ref.snapshot_id for ref in iceberg.metadata.refs.values()}
        cutoff = before.timestamp() * 1000
        doomed = [
            snapshot.snapshot_id
            for snapshot in iceberg.metadata.snapshots
            if snapshot.timestamp_ms < cutoff and snapshot.snapshot_id not in protected
        ]
        if not doomed:
            return iceberg, 0
        try:
            iceberg.maintenance.expire_snapshots().by_ids(doomed).commit()
        except CommitFailedException:
            if attempt + 1 == _EXPIRY_ATTEMPTS:
                raise
            iceberg = iceberg.refresh()
            continue
        crash_point("warehouse.snapshots_expired")
        return iceberg.refresh(), len(doomed)
    raise AssertionError("unreachable")


def _key(io: PyArrowFileIO, location: str) -> str:
    """A file's location as its file system lists it (`/abs/path`, `bucket/key`)."""
    return io.parse_location(location, io.properties)[2]


def referenced_files(iceberg: Table) -> set[str]:
    """Every file the table's current metadata reaches, as its file system names it: the
    metadata file and those it logs, each snapshot's manifest list, manifests and their data and
    delete files (deleted entries too: conservative), statistics files."""
    io, metadata = iceberg.io, iceberg.metadata
    assert isinstance(io, PyArrowFileIO)
    locations = [
        iceberg.metadata_location,
        *(entry.metadata_file for entry in metadata.metadata_log),
    ]
    locations += [stats.statistics_path for stats in metadata.statistics]
    locations += [stats.statistics_path for stats in metadata.partition_statistics]
    manifests: dict[str, object] = {}
    for snapshot in metadata.snapshots:
        locations.append(snapshot.manifest_list)
        for manifest in snapshot.manifests(io):
            manifests.setdefault(manifest.manifest_path, manifest)
    locations += manifests
    for manifest in manifests.values():
        entries = manifest.fetch_manifest_entry(io, discard_deleted=False)  # type: ignore[attr-defined]
        locations += [entry.data_file.file_path for entry in entries]
    return {_key(io, location) for location in locations}


def _remove_orphans(iceberg: Table, before: datetime) -> tuple[int, int]:
    """Delete the table's unreferenced files older than `before`; (files, bytes)."""
    io = iceberg.io
    assert isinstance(io, PyArrowFileIO)
    keep = referenced_files(iceberg)
    scheme, netloc, root = io.parse_location(iceberg.location(), io.properties)
    filesystem = io.fs_by_scheme(scheme, netloc)
    removed, freed = 0, 0
    for folder in ("data", "metadata"):
        selector = FileSelector(
            f"{root.rstrip('/')}/{folder}", recursive=True, allow_not_found=True
        )
        for info in filesystem.get_file_info(selector):
            if info.type != FileType.File or info.path in keep:
                continue
            if info.mtime is None or info.mtime.astimezone(UTC) >= before:
                continue
            filesystem.delete_file(info.path)
            removed, freed = removed + 1, freed + (info.size or 0)
    if removed:
        crash_point("warehouse.orphans_removed")
    return removed, freed


def _metadata_bytes(iceberg: Table) -> int:
    io = iceberg.io
    return len(io.new_input(iceberg.metadata_location).open().read())


def maintain_table(
    iceberg: Table, name: str, *, expire_before: datetime, orphans_before: datetime
) -> TableMaintenance:
    """Expire `iceberg`'s snapshots older than `expire_before`, then remove its orphan files
    older than `orphans_before`. The catalog busy past its timeout ("database is locked": a
    night's commits), or a file system error, is a `StorageError` naming the table."""
    try:
        iceberg, expired = _expire(iceberg, expire_before)
        files, freed = _remove_orphans(iceberg, orphans_before)
    except (SQLAlchemyError, OSError) as error:
        raise StorageError(f"could not maintain table {name}: {error}") from error
    snapshot = iceberg.current_snapshot()
    return TableMaintenance(
        table=name,
        snapshots_expired=expired,
        snapshots_kept=len(iceberg.metadata.snapshots),
        files_removed=files,
        bytes_removed=freed,
        manifests=len(snapshot.manifests(iceberg.io)) if snapshot else 0,
        metadata_bytes=_metadata_bytes(iceberg),
    )


def maintain(
    warehouse: Warehouse,
    *,
    retention: timedelta,
    orphan_age: timedelta = ORPHAN_AGE,
    now: datetime | None = None,
    tables: Iterable[str] | None = None,
) -> list[TableMaintenance]:
    """Maintain every output table the catalog holds (a table never written is skipped)."""
    now = now or datetime.now(UTC)
    reports = []
    for name in tables if tables is not None else TABLES:
        iceberg = warehouse.iceberg_table(name)
        if iceberg is None:
            continue
        report = maintain_table(
            iceberg, name, expire_before=now - retention, orphans_before=now - orphan_age
        )
        logger.info("maintained %s: %s", name, report.model_dump_json())
        reports.append(report)
    return reports
