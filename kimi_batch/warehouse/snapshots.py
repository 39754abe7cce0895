"""Snapshots as names a person uses: each night's tag, `--as-of` resolved, the newest per table.

    tag_night(warehouse, "2026-12-04")       each table's current snapshot tagged night-2026-12-04
    resolve_as_of(warehouse, "night-2026-12-04" | "7234..." | "2026-12-04" | "2026-12-04T06:00")
        -> {table: snapshot id}: what `Warehouse.pinned` reads
    newest_snapshots(warehouse) -> [TableSnapshot]: `kimi-batch status`'s `tables`

An as-of names one table's state directly (its snapshot id, or its tag) and fixes every other
table at the same moment: a snapshot id of `distilled` reads `seeds` and `quarantine` as they
were when that snapshot was committed, and a table the tag is missing from is read as of the
newest tagged commit. A date is the end of that day UTC; a date-time without a zone is UTC.
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, time, timedelta

from pydantic import BaseModel, ConfigDict
from pyiceberg.exceptions import CommitFailedException, NoSuchNamespaceError, NoSuchTableError
from pyiceberg.table import Table
from pyiceberg.table.refs import SnapshotRefType
from sqlalchemy.exc import SQLAlchemyError

from kimi_batch.crash_points import crash_point
from kimi_batch.errors import ConfigError
from kimi_batch.storage import StorageError
from kimi_batch.warehouse.catalog import COMMIT_RETRIES, open_catalog
from kimi_batch.warehouse.schema import validate_ds
from kimi_batch.warehouse.tables import Warehouse

NIGHT_TAG_PREFIX = "night-"
_SNAPSHOT_ID = re.compile(r"^-?[0-9]+$")


def night_tag(night: str | date) -> str:
    """The tag of the night of day `night`: `night-YYYY-MM-DD`."""
    return NIGHT_TAG_PREFIX + validate_ds(night)


class TableSnapshot(BaseModel):
    """A table's current snapshot and the newest night tag it carries."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    table: str
    snapshot_id: int
    committed_at: datetime
    night_tag: str | None  # the newest `night-` tag of the table (on any of its snapshots)
    night_snapshot_id: int | None


def _iceberg_tables(warehouse: Warehouse) -> dict[str, Table]:
    """Every table of the warehouse's namespace, by name; none when the catalog does not exist
    yet (nothing is created by a read)."""
    spec = warehouse.spec
    if spec.sqlite_path is not None and not spec.sqlite_path.exists():
        return {}
    try:
        catalog = open_catalog(spec)
        names = [identifier[-1] for identifier in catalog.list_tables(spec.namespace)]
        return {name: catalog.load_table((spec.namespace, name)) for name in sorted(names)}
    except (NoSuchNamespaceError, NoSuchTableError):
        return {}
    except (SQLAlchemyError, OSError) as error:
        raise StorageError(f"the tables' catalog is unreadable: {error}") from error


def _tag_table(iceberg: Table, tag: str) -> int | None:
    """Point `tag` at the table's current snapshot (moved in one commit when it pointed
    elsewhere); the snapshot tagged, None for a table without one."""
    for _attempt in range(COMMIT_RETRIES):
        current = iceberg.current_snapshot()
        if current is None:
            return None
        ref = iceberg.refs().get(tag)
        if ref is not None and ref.snapshot_id == current.snapshot_id:
            return current.snapshot_id
        manage = iceberg.manage_snapshots()
        if ref is not None:
            manage = manage.remove_tag(tag)
        try:
            manage.create_tag(current.snapshot_id, tag).commit()
        except CommitFailedException:
            iceberg = iceberg.refresh()  # a partition landed meanwhile: tag the newer snapshot
        except (SQLAlchemyError, OSError) as error:
            raise StorageError(f"could not tag {iceberg.name()} {tag}: {error}") from error
        else:
            crash_point("warehouse.night_tagged")
            return current.snapshot_id
    raise StorageError(f"could not tag {iceberg.name()} {tag}: every commit lost a race")


def tag_night(warehouse: Warehouse, night: str | date) -> dict[str, int]:
    """Tag each table's current snapshot `night-YYYY-MM-DD` (a re-run night moves the tag):
    table -> the snapshot tagged."""
    tag = night_tag(night)
    tagged: dict[str, int] = {}
    for name, iceberg in _iceberg_tables(warehouse).items():
        snapshot = _tag_table(iceberg, tag)
        if snapshot is not None:
            tagged[name] = snapshot
    return tagged


def _millis(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def _as_of_moment(text: str) -> datetime | None:
    """The end of a day (its last millisecond, UTC) or a date-time (UTC unless it says); None
    for text that is neither."""
    try:
        if len(text) == 10:
            day = date.fromisoformat(text)
            return datetime.combine(day + timedelta(days=1), time(), UTC) - timedelta(
                milliseconds=1
            )
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _at(tables: dict[str, Table], millis: int) -> dict[str, int]:
    """Each table's snapshot current at `millis` (tables that had none then are left out)."""
    found: dict[str, int] = {}
    for name, iceberg in tables.items():
        snapshot = iceberg.snapshot_as_of_timestamp(millis)
        if snapshot is not None:
            found[name] = snapshot.snapshot_id
    return found


def _committed_ms(iceberg: Table, snapshot_id: int) -> int:
    snapshot = iceberg.snapshot_by_id(snapshot_id)
    return snapshot.timestamp_ms if snapshot else 0


def _by_snapshot_id(tables: dict[str, Table], snapshot_id: int) -> dict[str, int] | None:
    for name, iceberg in tables.items():
        if iceberg.snapshot_by_id(snapshot_id) is not None:
            at = _at(tables, _committed_ms(iceberg, snapshot_id))
            return {**at, name: snapshot_id}
    return None


def _by_tag(tables: dict[str, Table], tag: str) -> dict[str, int] | None:
    tagged = {
        name: ref.snapshot_id
        for name, iceberg in tables.items()
        if (ref := iceberg.refs().get(tag)) is not None
        and ref.snapshot_ref_type == SnapshotRefType.TAG
    }
    if not tagged:
        return None
    newest = max(_committed_ms(tables[name], snapshot) for name, snapshot in tagged.items())
    untagged = {name: iceberg for name, iceberg in tables.items() if name not in tagged}
    return {**_at(untagged, newest), **tagged}


def resolve_as_of(warehouse: Warehouse, as_of: str, *, required: str) -> dict[str, int]:
    """Table -> snapshot id for `as_of` (a snapshot id, a tag, a date or a date-time);
    ConfigError when it names nothing or when table `required` had no snapshot then."""
    text = as_of.strip()
    tables = _iceberg_tables(warehouse)
    moment = None if _SNAPSHOT_ID.fullmatch(text) else _as_of_moment(text)
    if _SNAPSHOT_ID.fullmatch(text):
        found, what = _by_snapshot_id(tables, int(text)), f"snapshot {text}"
    elif moment is not None:
        found, what = _at(tables, _millis(moment)), moment.isoformat()
    else:
        found, what = _by_tag(tables, text), f"tag {text!r}"
    if found is None:
        raise ConfigError(f"--as-of {as_of}: no table has {what}")
    if required not in found:
        first = _first_commit(tables.get(required))
        since = f"its first snapshot is of {first.isoformat()}" if first else "it has none"
        raise ConfigError(
            f"--as-of {as_of}: the {required} table had no snapshot at {what} ({since})"
        )
    return found


def _first_commit(iceberg: Table | None) -> datetime | None:
    history = iceberg.history() if iceberg else []
    return datetime.fromtimestamp(history[0].timestamp_ms / 1000, UTC) if history else None


def _newest_night_tag(iceberg: Table) -> tuple[str, int] | None:
    tags = [
        (name, ref.snapshot_id)
        for name, ref in iceberg.refs().items()
        if ref.snapshot_ref_type == SnapshotRefType.TAG and name.startswith(NIGHT_TAG_PREFIX)
    ]
    return max(tags) if tags else None  # night-YYYY-MM-DD sorts by its day


def current_snapshots(warehouse: Warehouse) -> dict[str, int]:
    """Table -> its current snapshot id (tables without one are left out)."""
    return {snapshot.table: snapshot.snapshot_id for snapshot in newest_snapshots(warehouse)}


def newest_snapshots(warehouse: Warehouse) -> list[TableSnapshot]:
    """Each table's current snapshot, its commit time and its newest night tag."""
    found: list[TableSnapshot] = []
    for name, iceberg in _iceberg_tables(warehouse).items():
        current = iceberg.current_snapshot()
        if current is None:
            continue
        night = _newest_night_tag(iceberg)
        found.append(
            TableSnapshot(
                table=name,
                snapshot_id=current.snapshot_id,
                committed_at=datetime.fromtimestamp(current.timestamp_ms / 1000, UTC),
                night_tag=night[0] if night else None,
                night_snapshot_id=night[1] if night else None,
            )
        )
    return found
