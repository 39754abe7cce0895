"""Storage layer: Parquet warehouse in Hive layout, and Trino tables over it.

    open_warehouse(settings).write_partition(table, ds, source, rows) -> PartitionWrite
        (a `Warehouse` folder, or an `ObjectWarehouse` for an s3:// KIMI_BATCH_WAREHOUSE)
    TrinoReader(TrinoConfig(host=...)).count(table, ds, source): the tables as Trino reads them

Tables and their row models: `TABLES` (amplified, distilled, quarantine). The layers above import
from here, never from the modules. Errors: see `kimi_batch.storage.exceptions`.
"""

from kimi_batch.storage.api_batches import (
    RequestCounts,
    batch_lines,
    begin_batch,
    finish_batch,
    iter_batch_lines,
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
from kimi_batch.storage.dedup_index import (
    DedupIndex,
    DedupSetting,
    IndexedText,
    index_entries,
    rescreen_partitions,
    shingles,
)
from kimi_batch.storage.exceptions import (
    InvalidIdentifierError,
    InvalidPartitionError,
    SchemaMismatchError,
    StorageError,
    TrinoQueryError,
    TrinoUnavailableError,
)
from kimi_batch.storage.inbox import InboxFile, file_sha256, inspect_inbox_file, scan_inbox
from kimi_batch.storage.landing import Assignment, Landing, landed_versions
from kimi_batch.storage.object_warehouse import ObjectWarehouse, open_warehouse
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
from kimi_batch.storage.quality_gate import (
    CONTAMINATED,
    DUPLICATE,
    NEAR_DUPLICATE,
    PartitionGate,
    QualityGate,
    set_aside_totals,
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
from kimi_batch.storage.seeds import land_input, land_seeds
from kimi_batch.storage.settle import (
    SETTLE_S,
    InputNotSettledError,
    still_changing,
    wait_until_settled,
)
from kimi_batch.storage.trino import TrinoConfig, TrinoReader, catalog_properties, write_catalog
from kimi_batch.storage.versions import CurrentVersion, PartitionVersions, version_prefix

__all__ = [
    "CONTAMINATED",
    "DUPLICATE",
    "MAX_VALIDATION_ATTEMPTS",
    "NEAR_DUPLICATE",
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
    "CurrentVersion",
    "DedupIndex",
    "DedupSetting",
    "FileRecord",
    "FileTooLargeError",
    "InboxFile",
    "InboxLanding",
    "IndexedText",
    "InputNotSettledError",
    "InvalidIdentifierError",
    "InvalidPartitionError",
    "Landing",
    "ObjectWarehouse",
    "PartitionGate",
    "PartitionVersions",
    "PartitionWrite",
    "QualityGate",
    "RequestCounts",
    "ResolvedInput",
    "SchemaMismatchError",
    "StagedFile",
    "StorageError",
    "TrinoConfig",
    "TrinoQueryError",
    "TrinoReader",
    "TrinoUnavailableError",
    "ValidationClaim",
    "Warehouse",
    "batch_lines",
    "begin_batch",
    "catalog_properties",
    "columns",
    "file_sha256",
    "finish_batch",
    "index_entries",
    "inspect_inbox_file",
    "iter_batch_lines",
    "land_inbox",
    "land_input",
    "land_seeds",
    "landed_versions",
    "open_warehouse",
    "polars_schema",
    "private_folder",
    "private_folder_swap",
    "private_writer",
    "process_owner",
    "remove_stale_temps",
    "replace_quarantine",
    "request_counts",
    "rescreen_partitions",
    "resolve_input",
    "resolve_partition",
    "resume_abandoned",
    "scan_inbox",
    "set_aside_totals",
    "settle_cancelled",
    "shingles",
    "still_changing",
    "temp_name",
    "trino_columns",
    "validate_batch",
    "validate_ds",
    "validate_identifier",
    "validate_source",
    "version_prefix",
    "wait_until_settled",
    "write_batch_files",
    "write_catalog",
    "write_private_text",
]
