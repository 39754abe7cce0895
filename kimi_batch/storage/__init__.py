"""Storage layer: Parquet warehouse in Hive layout, and Trino tables over it.

    Warehouse(root).write_partition(table, ds, source, rows) -> PartitionWrite
    TrinoPublisher(TrinoConfig(host=...)).publish_partition(warehouse, table, ds, source)

Tables and their row models: `TABLES` (amplified, distilled, quarantine). Errors: see
`kimi_batch.storage.exceptions`.
"""

from kimi_batch.storage.exceptions import (
    InvalidIdentifierError,
    InvalidPartitionError,
    SchemaMismatchError,
    StorageError,
    TrinoQueryError,
    TrinoUnavailableError,
)
from kimi_batch.storage.parquet import PartitionWrite, Warehouse, validate_ds, validate_source
from kimi_batch.storage.schema import (
    PARTITION_COLUMNS,
    TABLES,
    Column,
    columns,
    polars_schema,
    trino_columns,
    validate_identifier,
)
from kimi_batch.storage.trino import PublishReport, TrinoConfig, TrinoPublisher

__all__ = [
    "PARTITION_COLUMNS",
    "TABLES",
    "Column",
    "InvalidIdentifierError",
    "InvalidPartitionError",
    "PartitionWrite",
    "PublishReport",
    "SchemaMismatchError",
    "StorageError",
    "TrinoConfig",
    "TrinoPublisher",
    "TrinoQueryError",
    "TrinoUnavailableError",
    "Warehouse",
    "columns",
    "polars_schema",
    "trino_columns",
    "validate_ds",
    "validate_identifier",
    "validate_source",
]
