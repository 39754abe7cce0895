"""What is left of the storage layer once the features have their packages: the landed input
versions (`landing`: the manifest; `snapshot`, `settle`, `partition_input`), what the inbox
sensor asks for (`inbox_tick`), and the landing writes of the seeds and the quarantine rows
(`seeds`, `quarantine`), which go with `landing` to `inputs/` and `pipeline/`; and the file primitives several features share (`private_files`:
owner-only writes; `blobs`: content-addressed files every host reads) with the storage errors
(`exceptions`). Other packages import from here, never from the modules.
"""

from kimi_batch.storage.blobs import BlobStore, SharedBlobs
from kimi_batch.storage.exceptions import (
    InvalidIdentifierError,
    InvalidPartitionError,
    SchemaMismatchError,
    StorageError,
    TrinoQueryError,
    TrinoTimeoutError,
    TrinoUnavailableError,
)
from kimi_batch.storage.inbox_tick import (
    HASH_BUDGET_S,
    LAND_BUDGET_S,
    InboxCursor,
    InboxRequest,
    IngestRun,
    land_for_any_host,
    landing_retries,
    plan_inbox_tick,
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
    pid_alive,
    private_folder,
    private_folder_swap,
    private_writer,
    remove_stale_temps,
    temp_name,
    write_private_text,
)
from kimi_batch.storage.seeds import land_input, land_seeds
from kimi_batch.storage.snapshot import (
    SETTLE_S,
    InputNotSettledError,
    still_changing,
    wait_until_settled,
)

__all__ = [
    "HASH_BUDGET_S",
    "LAND_BUDGET_S",
    "SETTLE_S",
    "Assignment",
    "BlobStore",
    "InboxCursor",
    "InboxLanding",
    "InboxRequest",
    "IngestRun",
    "InputNotSettledError",
    "InvalidIdentifierError",
    "InvalidPartitionError",
    "Landing",
    "ResolvedInput",
    "SchemaMismatchError",
    "SharedBlobs",
    "StorageError",
    "TrinoQueryError",
    "TrinoTimeoutError",
    "TrinoUnavailableError",
    "land_for_any_host",
    "land_inbox",
    "land_input",
    "land_seeds",
    "landed_versions",
    "landing_retries",
    "pid_alive",
    "plan_inbox_tick",
    "private_folder",
    "private_folder_swap",
    "private_writer",
    "remove_stale_temps",
    "resolve_input",
    "resolve_partition",
    "still_changing",
    "temp_name",
    "wait_until_settled",
    "write_private_text",
]
