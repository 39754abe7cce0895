"""The OpenAI-compatible Batch API, Dagster-free: its lines (`lines`: an input file validated as
it streams into requests, the bodies as models and the fields a line may hold, a line error, the
output and error lines), the store (`store`: files and batch records), and a batch's lifecycle
(`lifecycle`: validated and landed by a worker, which batches need a run, taken up, answered as
a stage of its own (`ApiBatchTask`), counted, its files written, finished, or finalized when its
run ended).

The HTTP server (`kimi-batch api`) is the sub-package `web`, above `defs` (with no daemon it
starts the batches' runs itself). Other packages import from here, never from the modules.
"""

from kimi_batch.batch_api.lifecycle import (
    MAX_FINISH_ATTEMPTS,
    MAX_VALIDATION_ATTEMPTS,
    NOT_JSON_REASON,
    ApiBatchInputs,
    ApiBatchTask,
    BatchRunState,
    BatchValidator,
    RequestCounts,
    batch_controls,
    batch_lines,
    batches_to_run,
    begin_batch,
    cancelled_message,
    finish_abandoned_batch,
    finish_batch,
    iter_batch_lines,
    request_counts,
    resume_abandoned,
    settle_cancelled,
    validate_batch,
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
from kimi_batch.batch_api.store import (
    NEXT_STATUSES,
    TERMINAL_STATUSES,
    ApiStore,
    BatchRecord,
    BatchStatus,
    FileContentMissingError,
    FileRecord,
    FileTooLargeError,
    StagedFile,
    ValidationClaim,
    process_owner,
    process_running,
    process_token,
)

__all__ = [
    "API_STAGE",
    "BATCH_ENDPOINTS",
    "MAX_FINISH_ATTEMPTS",
    "MAX_VALIDATION_ATTEMPTS",
    "NEXT_STATUSES",
    "NOT_JSON_REASON",
    "TERMINAL_STATUSES",
    "AnsweredRequest",
    "ApiBatchInputs",
    "ApiBatchTask",
    "ApiStore",
    "BatchLineError",
    "BatchRecord",
    "BatchRequestLine",
    "BatchRunState",
    "BatchStatus",
    "BatchValidator",
    "FileContentMissingError",
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
    "process_running",
    "process_token",
    "request_counts",
    "response_line",
    "resume_abandoned",
    "settle_cancelled",
    "validate_batch",
    "write_batch_files",
]
