"""Snapshots as names a person uses: each night's tag, `--as-of` resolved, the newest per table.

    tag_night(warehouse, "2026-12-04")       each table's current snapshot tagged night-2026-12-04
    resolve_as_of(warehouse, "night-2026-12-04" | "7234..." | "2026-12-04" | "2026-12-04T06:00")
        -> {table: snapshot id}: what `Warehouse.pinned` reads
    newest_snapshots(warehouse) -> [TableSnapshot]: `kimi-batch status`'s `tables`

An as-of names one table's state directly (its snapshot id, or its tag) and fixes every other
table at the same moment: a snapshot id of `distilled` reads `seeds` and `quarantine` as they
were when that snapshot was committed, and a table the tag is missing from is read as of the
newest tagged commit. A date is the end of that day UTC; a date-time without a zone is UTC.
A moment whose state maintenance expired (the snapshot current then, or one between it and the
next kept one, is gone) is refused, never read as an older kept snapshot (`_current_at`).
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, time

from pydantic import BaseModel, ConfigDict
from pyiceberg.exceptions import CommitFailedException, NoSuchNamespaceError, NoSuchTableError
from pyiceberg.table import Table
from pyiceberg.table.refs import SnapshotRefType
from pyiceberg.table.snapshots import Snapshot
from sqlalchemy.exc import SQLAlchemyError

from kimi_batch.crash_points import crash_point
from kimi_batch.errors import ConfigError
from kimi_batch.storage import StorageError
from kimi_batch.warehouse.schema import validate_ds
from kimi_batch.warehouse.tables import COMMIT_RETRIES, Warehouse, open_catalog

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
            # Its last millisecond, said directly: the next day's midnight less 1 ms has no
            # next day after 9999-12-31.
            return datetime.combine(date.fromisoformat(text), time(23, 59, 59, 999000), UTC)
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


class _HistoryExpiredError(Exception):
    """A table's state at a moment that maintenance's expiry left unreadable (the message)."""

    def __init__(self, message: str, table: str, millis: int) -> None:
        super().__init__(message)
        self.table, self.millis = table, millis


def _iso(millis: int) -> str:
    return datetime.fromtimestamp(millis / 1000, UTC).isoformat()


def _follows(snapshot: Snapshot | None, previous: int | None) -> bool:
    """Whether `snapshot` replaced `previous` directly (None: whether it is the table's first):
    every commit here is one snapshot whose parent is the one it replaced. An expiry clears the
    parent of a snapshot whose parent it removed, so a first snapshot is also told by its
    sequence number (1, format 2)."""
    if snapshot is None:
        return False
    if previous is not None:
        return snapshot.parent_snapshot_id == previous
    return snapshot.parent_snapshot_id is None and (snapshot.sequence_number or 0) <= 1


def _exact_since(iceberg: Table) -> int | None:
    """The oldest moment from which on every moment reads the table exactly: the commit after
    its last expired snapshot (None when none expired)."""
    since, previous = None, None
    for entry in iceberg.history():
        if not _follows(iceberg.snapshot_by_id(entry.snapshot_id), previous):
            since = entry.timestamp_ms
        previous = entry.snapshot_id
    return since


def _expired(iceberg: Table, name: str, millis: int) -> _HistoryExpiredError:
    """The refusal of `millis` for a table whose state then was expired."""
    since = _exact_since(iceberg)
    tags = sorted(
        (snapshot.timestamp_ms, tag)
        for tag, ref in iceberg.refs().items()
        if ref.snapshot_ref_type == SnapshotRefType.TAG
        and (snapshot := iceberg.snapshot_by_id(ref.snapshot_id)) is not None
        and snapshot.timestamp_ms <= millis
    )
    instead = [f"it reads exactly from {_iso(since)} on" if since is not None else ""]
    instead += [f"tag {tags[-1][1]} names its state of {_iso(tags[-1][0])}"] if tags else []
    return _HistoryExpiredError(
        f"the {name} table's history at {_iso(millis)} was expired by maintenance "
        f"(KIMI_BATCH_SNAPSHOT_RETENTION_DAYS); " + "; ".join(part for part in instead if part),
        name,
        millis,
    )


def _current_at(iceberg: Table, name: str, millis: int) -> int | None:
    """The table's snapshot current at `millis`, None when it had none yet.

    Expiry removes a snapshot's entry from the snapshot log, so the newest entry at or before a
    moment may name a snapshot that was replaced before it (pyiceberg's `snapshot_as_of_timestamp`
    reads it all the same). The entry at or before the moment was current then only when the
    next entry follows it directly (or there is none); a moment before the first entry found no
    snapshot only when that entry is the table's first snapshot. Otherwise `_HistoryExpiredError`.
    """
    log = iceberg.history()
    at = None
    for index, entry in enumerate(log):
        if entry.timestamp_ms <= millis:
            at = index
    if at is None:
        if log and not _follows(iceberg.snapshot_by_id(log[0].snapshot_id), None):
            raise _expired(iceberg, name, millis)
        return None
    entry = log[at]
    if iceberg.snapshot_by_id(entry.snapshot_id) is None:
        raise _expired(iceberg, name, millis)
    following = iceberg.snapshot_by_id(log[at + 1].snapshot_id) if at + 1 < len(log) else None
    if (
        entry.timestamp_ms < millis
        and at + 1 < len(log)
        and not _follows(following, entry.snapshot_id)
    ):
        raise _expired(iceberg, name, millis)
    return entry.snapshot_id


def _had_none(iceberg: Table | None, name: str, millis: int) -> bool:
    """Whether the table surely had no snapshot at `millis` (never written, or not yet)."""
    try:
        return iceberg is None or _current_at(iceberg, name, millis) is None
    except _HistoryExpiredError:
        return False


def _at(tables: dict[str, Table], millis: int) -> dict[str, int]:
    """Each table's snapshot current at `millis` (tables that had none then are left out);
    `_HistoryExpiredError` when a table's state then is no longer known exactly."""
    found: dict[str, int] = {}
    for name, iceberg in tables.items():
        snapshot = _current_at(iceberg, name, millis)
        if snapshot is not None:
            found[name] = snapshot
    return found


def _committed_ms(iceberg: Table, snapshot_id: int) -> int:
    snapshot = iceberg.snapshot_by_id(snapshot_id)
    return snapshot.timestamp_ms if snapshot else 0


def _by_snapshot_id(tables: dict[str, Table], snapshot_id: int) -> dict[str, int] | None:
    for name, iceberg in tables.items():
        if iceberg.snapshot_by_id(snapshot_id) is not None:
            others = {other: table for other, table in tables.items() if other != name}
            return {**_at(others, _committed_ms(iceberg, snapshot_id)), name: snapshot_id}
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
    if tag.startswith(NIGHT_TAG_PREFIX):
        # A night tags every table that had a snapshot (`tag_night`): one without the tag and
        # without a snapshot by then had none, whatever expired since.
        untagged = {
            name: iceberg
            for name, iceberg in untagged.items()
            if any(entry.timestamp_ms <= newest for entry in iceberg.history())
        }
    return {**_at(untagged, newest), **tagged}


def resolve_as_of(warehouse: Warehouse, as_of: str, *, required: str) -> dict[str, int]:
    """Table -> snapshot id for `as_of` (a snapshot id, a tag, a date or a date-time);
    ConfigError when it names nothing or when table `required` had no snapshot then."""
    text = as_of.strip()
    tables = _iceberg_tables(warehouse)
    tables = dict(sorted(tables.items(), key=lambda item: item[0] != required))  # its error first
    moment = None if _SNAPSHOT_ID.fullmatch(text) else _as_of_moment(text)
    try:
        if _SNAPSHOT_ID.fullmatch(text):
            found, what = _by_snapshot_id(tables, int(text)), f"snapshot {text}"
        elif moment is not None:
            found, what = _at(tables, _millis(moment)), moment.isoformat()
        else:
            found, what = _by_tag(tables, text), f"tag {text!r}"
    except _HistoryExpiredError as error:
        if moment is None or not _had_none(tables.get(required), required, error.millis):
            raise ConfigError(f"--as-of {as_of}: {error}") from None
        found, what = {}, moment.isoformat()  # `required` had no snapshot then: refused as such
    if found is None and _SNAPSHOT_ID.fullmatch(text):
        raise ConfigError(
            f"--as-of {as_of}: no table has {what} (maintenance expires a snapshot no tag "
            "names once older than KIMI_BATCH_SNAPSHOT_RETENTION_DAYS)"
        )
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
