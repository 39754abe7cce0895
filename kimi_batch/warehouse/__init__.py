"""The warehouse: the output tables as Apache Iceberg tables in a catalog in the state database.

    open_warehouse(settings).write_partition(table, ds, source, rows, guard=lease) -> PartitionWrite

One commit replaces a partition; the lease is confirmed inside that commit (`tables`); readers
see the current snapshot, or the ones a `pinned` warehouse names. Trino, polars, Spark and DuckDB
read the same tables through the same catalog. Each night's snapshots are tagged
`night-YYYY-MM-DD`, and an as-of (snapshot id, tag, date) resolves to one snapshot a table
(`snapshots`).

The tables' schemas come from the row models (`schema`: `TABLES`, their polars and Trino types),
each stage replaces only its rows of the quarantine table (`quarantine`), and Trino reads the
same tables (`trino`: its catalog file and `TrinoReader`). Other packages import from here, never
from the modules.

The members that need pyiceberg's tables and pyarrow are imported on first use (`__getattr__`):
they cost a process ~3 s, and writing Trino's catalog file (`kimi-batch publish`, every
`scripts/trino.sh start`) needs none of them.
"""

import importlib
import typing

from kimi_batch.warehouse.schema import (
    CATALOG_NAME,
    LEDGER_SCHEMA,
    PARTITION_COLUMNS,
    TABLES,
    columns,
    polars_schema,
    trino_columns,
    validate_ds,
    validate_source,
)
from kimi_batch.warehouse.trino import (
    TrinoConfig,
    TrinoQueryError,
    TrinoReader,
    TrinoTimeoutError,
    TrinoUnavailableError,
    catalog_properties,
    catalog_property_map,
    write_catalog,
)

if typing.TYPE_CHECKING:
    from kimi_batch.warehouse.maintenance import TableMaintenance, maintain
    from kimi_batch.warehouse.migration import (
        HivePartition,
        MigratedPartition,
        MigrationError,
        hive_partitions,
        migrate,
    )
    from kimi_batch.warehouse.snapshots import (
        NIGHT_TAG_PREFIX,
        TableSnapshot,
        current_snapshots,
        newest_snapshots,
        night_tag,
        resolve_as_of,
        tag_night,
    )
    from kimi_batch.warehouse.tables import (
        CatalogSpec,
        PartitionWrite,
        Warehouse,
        open_catalog,
        open_warehouse,
    )

__all__ = [
    "CATALOG_NAME",
    "LEDGER_SCHEMA",
    "NIGHT_TAG_PREFIX",
    "PARTITION_COLUMNS",
    "TABLES",
    "CatalogSpec",
    "HivePartition",
    "MigratedPartition",
    "MigrationError",
    "PartitionWrite",
    "TableMaintenance",
    "TableSnapshot",
    "TrinoConfig",
    "TrinoQueryError",
    "TrinoReader",
    "TrinoTimeoutError",
    "TrinoUnavailableError",
    "Warehouse",
    "catalog_properties",
    "catalog_property_map",
    "columns",
    "current_snapshots",
    "hive_partitions",
    "maintain",
    "migrate",
    "newest_snapshots",
    "night_tag",
    "open_catalog",
    "open_warehouse",
    "polars_schema",
    "resolve_as_of",
    "tag_night",
    "trino_columns",
    "validate_ds",
    "validate_source",
    "write_catalog",
]

# The module of each member imported on first use.
_LAZY_MEMBERS = {
    "TableMaintenance": "maintenance",
    "maintain": "maintenance",
    "HivePartition": "migration",
    "MigratedPartition": "migration",
    "MigrationError": "migration",
    "hive_partitions": "migration",
    "migrate": "migration",
    "NIGHT_TAG_PREFIX": "snapshots",
    "TableSnapshot": "snapshots",
    "current_snapshots": "snapshots",
    "newest_snapshots": "snapshots",
    "night_tag": "snapshots",
    "resolve_as_of": "snapshots",
    "tag_night": "snapshots",
    "CatalogSpec": "tables",
    "PartitionWrite": "tables",
    "Warehouse": "tables",
    "open_catalog": "tables",
    "open_warehouse": "tables",
}


def __getattr__(name: str) -> object:
    """A member that needs pyiceberg's tables, from its module (imported then)."""
    module = _LAZY_MEMBERS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    found = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = found
    return found
