"""The OpenAI-compatible Batch API, Dagster-free: its lines (`lines`: a validated request line, a
line error, the output and error lines), the request bodies as models (`request_bodies`) and the
fields a line may hold (`request_fields`), an input file validated as it streams (`scan`), the
store (`file_store`: content-addressed files; `store`: batch records and their statuses), the
validation worker (`validation`), a batch's way through its run (`lifecycle`) and which batches
need a run, or are left by a run that ended (`runs`).

The HTTP server (`kimi-batch api`) is the sub-package `web`, above `defs` (with no daemon it
starts the batches' runs itself). Other packages import from here, never from the modules.
"""

from kimi_batch.batch_api.file_store import FileRecord, FileTooLargeError, StagedFile
from kimi_batch.batch_api.lifecycle import (
    RequestCounts,
    batch_lines,
    begin_batch,
    finish_batch,
    iter_batch_lines,
    request_counts,
    write_batch_files,
)
from kimi_batch.batch_api.lines import (
    API_STAGE,
    BATCH_ENDPOINTS,
    AnsweredRequest,
    BatchLineError,
    BatchRequestLine,
    error_line,
    response_line,
)
from kimi_batch.batch_api.runs import (
    MAX_FINISH_ATTEMPTS,
    BatchRunState,
    batch_controls,
    batches_to_run,
    cancelled_message,
    finish_abandoned_batch,
)
from kimi_batch.batch_api.store import (
    NEXT_STATUSES,
    TERMINAL_STATUSES,
    ApiStore,
    BatchRecord,
    BatchStatus,
    ValidationClaim,
    process_owner,
)
from kimi_batch.batch_api.validation import (
    MAX_VALIDATION_ATTEMPTS,
    BatchValidator,
    resume_abandoned,
    settle_cancelled,
    validate_batch,
)

__all__ = [
    "API_STAGE",
    "BATCH_ENDPOINTS",
    "MAX_FINISH_ATTEMPTS",
    "MAX_VALIDATION_ATTEMPTS",
    "NEXT_STATUSES",
    "TERMINAL_STATUSES",
    "AnsweredRequest",
    "ApiStore",
    "BatchLineError",
    "BatchRecord",
    "BatchRequestLine",
    "BatchRunState",
    "BatchStatus",
    "BatchValidator",
    "FileRecord",
    "FileTooLargeError",
    "RequestCounts",
    "StagedFile",
    "ValidationClaim",
    "batch_controls",
    "batch_lines",
    "batches_to_run",
    "begin_batch",
    "cancelled_message",
    "error_line",
    "finish_abandoned_batch",
    "finish_batch",
    "iter_batch_lines",
    "process_owner",
    "request_counts",
    "response_line",
    "resume_abandoned",
    "settle_cancelled",
    "validate_batch",
    "write_batch_files",
]
