"""Storage layer: Parquet warehouse in Hive layout, and Trino tables over it.

    warehouse_at(settings.paths)          the local folder (Warehouse) or the s3:// prefix
                                          (ObjectWarehouse: versions and pointers)
    Warehouse(root).write_partition(table, ds, source, rows) -> PartitionWrite
    TrinoPublisher(TrinoConfig(host=...)).publish_partition(warehouse, table, ds, source)

Tables and their row models: `TABLES` (amplified, distilled, quarantine). The layers above import
from here, never from the modules. Errors: see `kimi_batch.storage.exceptions`.
"""

from kimi_batch.storage.api_batches import (
    RequestCounts,
    batch_lines,
    begin_batch,
    finish_batch,
    request_counts,
    write_batch_files,
)
from kimi_batch.storage.api_files import FileRecord, FileTooLargeError, StagedFile
from kimi_batch.storage.api_store import (
    NEXT_STATUSES,
    TERMINAL_STATUSES,
    ApiStore,
    BatchRecord,
    BatchStatus,
    ValidationClaim,
    process_owner,
)
from kimi_batch.storage.api_validation import (
    MAX_VALIDATION_ATTEMPTS,
    BatchValidator,
    resume_abandoned,
    settle_cancelled,
    validate_batch,
)
from kimi_batch.storage.exceptions import (
    InvalidIdentifierError,
    InvalidPartitionError,
    ObjectStoreError,
    SchemaMismatchError,
    StorageError,
    TrinoQueryError,
    TrinoUnavailableError,
)
from kimi_batch.storage.inbox import InboxFile, file_sha256, inspect_inbox_file, scan_inbox
from kimi_batch.storage.landing import Assignment, Landing, landed_versions
from kimi_batch.storage.object_warehouse import ObjectWarehouse, warehouse_at
from kimi_batch.storage.parquet import (
    PARTITION_COLUMNS,
    PartitionWrite,
    Warehouse,
    validate_ds,
    validate_source,
)
from kimi_batch.storage.partition_input import (
    InboxLanding,
    ResolvedInput,
    land_inbox,
    resolve_input,
    resolve_partition,
)
from kimi_batch.storage.private_files import (
    private_folder,
    private_folder_swap,
    private_writer,
    remove_stale_temps,
    temp_name,
    write_private_text,
)
from kimi_batch.storage.quarantine import replace_quarantine
from kimi_batch.storage.schema import (
    TABLES,
    Column,
    columns,
    polars_schema,
    trino_columns,
    validate_identifier,
)
from kimi_batch.storage.seeds import land_seeds
from kimi_batch.storage.settle import (
    SETTLE_S,
    InputNotSettledError,
    still_changing,
    wait_until_settled,
)
from kimi_batch.storage.trino import PublishReport, TrinoConfig, TrinoPublisher
from kimi_batch.storage.versions import PartitionVersions

__all__ = [
    "MAX_VALIDATION_ATTEMPTS",
    "NEXT_STATUSES",
    "PARTITION_COLUMNS",
    "SETTLE_S",
    "TABLES",
    "TERMINAL_STATUSES",
    "ApiStore",
    "Assignment",
    "BatchRecord",
    "BatchStatus",
    "BatchValidator",
    "Column",
    "FileRecord",
    "FileTooLargeError",
    "InboxFile",
    "InboxLanding",
    "InputNotSettledError",
    "InvalidIdentifierError",
    "InvalidPartitionError",
    "Landing",
    "ObjectStoreError",
    "ObjectWarehouse",
    "PartitionVersions",
    "PartitionWrite",
    "PublishReport",
    "RequestCounts",
    "ResolvedInput",
    "SchemaMismatchError",
    "StagedFile",
    "StorageError",
    "TrinoConfig",
    "TrinoPublisher",
    "TrinoQueryError",
    "TrinoUnavailableError",
    "ValidationClaim",
    "Warehouse",
    "batch_lines",
    "begin_batch",
    "columns",
    "file_sha256",
    "finish_batch",
    "inspect_inbox_file",
    "land_inbox",
    "land_seeds",
    "landed_versions",
    "polars_schema",
    "private_folder",
    "private_folder_swap",
    "private_writer",
    "process_owner",
    "remove_stale_temps",
    "replace_quarantine",
    "request_counts",
    "resolve_input",
    "resolve_partition",
    "resume_abandoned",
    "scan_inbox",
    "settle_cancelled",
    "still_changing",
    "temp_name",
    "trino_columns",
    "validate_batch",
    "validate_ds",
    "validate_identifier",
    "validate_source",
    "wait_until_settled",
    "warehouse_at",
    "write_batch_files",
    "write_private_text",
]
