"""The tables section of `kimi-batch status`: each Iceberg table's current snapshot (its id, its
commit time) and the newest night tag it carries (`night-YYYY-MM-DD`), what `export --as-of`
and a reader's `FOR VERSION AS OF` name. Read-only: a catalog that does not exist yet is not
created."""

from __future__ import annotations

from sqlalchemy.exc import SQLAlchemyError

from kimi_batch.cli.status_sections import TablesSection, TableState
from kimi_batch.settings import Settings
from kimi_batch.storage import StorageError
from kimi_batch.warehouse import newest_snapshots, open_warehouse


def tables_section(settings: Settings) -> TablesSection:
    """The newest snapshot of every table of the deployment's catalog."""
    warehouse = open_warehouse(settings)
    try:
        snapshots = newest_snapshots(warehouse)
    except (StorageError, SQLAlchemyError, OSError) as error:
        return TablesSection(
            warehouse=warehouse.location, error=f"the tables are unreadable: {error}"
        )
    return TablesSection(
        warehouse=warehouse.location,
        tables={
            s.table: TableState(
                snapshot_id=s.snapshot_id,
                committed_at=s.committed_at,
                night_tag=s.night_tag,
                night_snapshot_id=s.night_snapshot_id,
            )
            for s in snapshots
        },
    )
