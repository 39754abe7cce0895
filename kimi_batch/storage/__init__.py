"""Storage layer: the inbox and landed inputs, the quality gate, the Batch API's store, the
tables' schemas (the tables themselves are `kimi_batch.warehouse`'s), and Trino queries.

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
from kimi_batch.storage.exceptions import (
    InvalidIdentifierError,
    InvalidPartitionError,
    SchemaMismatchError,
    StorageError,
    TrinoQueryError,
    TrinoUnavailableError,
)
from kimi_batch.storage.landing import Assignment, Landing, landed_versions
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
    PARTITION_COLUMNS,
    TABLES,
    Column,
    columns,
    model_for,
    polars_schema,
    trino_columns,
    validate_ds,
    validate_identifier,
    validate_source,
)
from kimi_batch.storage.seeds import land_input, land_seeds
from kimi_batch.storage.settle import (
    SETTLE_S,
    InputNotSettledError,
    still_changing,
    wait_until_settled,
)
from kimi_batch.storage.trino import TrinoConfig, TrinoReader, catalog_properties, write_catalog

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
    "InboxLanding",
    "InputNotSettledError",
    "InvalidIdentifierError",
    "InvalidPartitionError",
    "Landing",
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
    "batch_lines",
    "begin_batch",
    "catalog_properties",
    "columns",
    "finish_batch",
    "iter_batch_lines",
    "land_inbox",
    "land_input",
    "land_seeds",
    "landed_versions",
    "model_for",
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
    "settle_cancelled",
    "still_changing",
    "temp_name",
    "trino_columns",
    "validate_batch",
    "validate_ds",
    "validate_identifier",
    "validate_source",
    "wait_until_settled",
    "write_batch_files",
    "write_catalog",
    "write_private_text",
]
