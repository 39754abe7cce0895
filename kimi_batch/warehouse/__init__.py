"""The warehouse: the output tables as Apache Iceberg tables in a catalog in the state database.

    open_warehouse(settings).write_partition(table, ds, source, rows, guard=lease) -> PartitionWrite

One commit replaces a partition; the lease is confirmed inside that commit (`catalog`); readers
see the current snapshot, or the ones a `pinned` warehouse names. Trino, polars, Spark and DuckDB
read the same tables through the same catalog.
"""

from kimi_batch.warehouse.catalog import CATALOG_NAME, LEDGER_SCHEMA, CatalogSpec, open_catalog
from kimi_batch.warehouse.tables import (
    PartitionWrite,
    Warehouse,
    open_warehouse,
)

__all__ = [
    "CATALOG_NAME",
    "LEDGER_SCHEMA",
    "CatalogSpec",
    "PartitionWrite",
    "Warehouse",
    "open_catalog",
    "open_warehouse",
]
