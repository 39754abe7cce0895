"""What comes in: the inbox (`inbox`: files listed and inspected, never trusted), the readers
(`reader`: one bounded pass over a JSONL, JSON, CSV or Parquet file, OpenAI batch lines among the
JSONL rows; `formats`: the incremental decoders; `raw_rows`: what a row may hold; `tools`: the
function tools a row offers; `seen_ids`: duplicate ids while a file streams), the prompts they
become (`prompts`: `SeedPrompt`, `InputBatch`, the `seeds` rows and back), and the landed
versions of the inbox files: the manifest and one version copied once it settled (`landing`),
what a partition reads (`partition_input`), what the inbox sensor asks for (`inbox_tick`) and the
`seeds` table's landing write (`seeds`). Other packages import from here, never from the modules.
"""

from kimi_batch.inputs.formats import MAX_ROW_BYTES, Item, jsonl_items, number_spelling
from kimi_batch.inputs.inbox import (
    InboxFile,
    InboxLinkError,
    file_sha256,
    inspect_inbox_file,
    sanitize_source,
    scan_inbox,
    sha256_of,
    short_hash,
)
from kimi_batch.inputs.inbox_tick import (
    HASH_BUDGET_S,
    LAND_BUDGET_S,
    InboxCursor,
    InboxRequest,
    IngestRun,
    land_for_any_host,
    landed_state,
    landing_retries,
    plan_inbox_tick,
)
from kimi_batch.inputs.landing import (
    SETTLE_S,
    Assignment,
    InputNotSettledError,
    Landing,
    landed_versions,
    still_changing,
    wait_until_settled,
)
from kimi_batch.inputs.partition_input import (
    InboxLanding,
    ResolvedInput,
    land_inbox,
    resolve_input,
    resolve_partition,
)
from kimi_batch.inputs.prompts import InputBatch, SeedPrompt, seed_rows, seeds_from_rows
from kimi_batch.inputs.raw_rows import format_validation_error
from kimi_batch.inputs.reader import InputReader, iter_inbox_rows, read_inbox_file
from kimi_batch.inputs.seeds import land_input, land_seeds
from kimi_batch.inputs.seen_ids import SeenIds
from kimi_batch.inputs.tools import FunctionTool, ToolFunction

__all__ = [
    "HASH_BUDGET_S",
    "LAND_BUDGET_S",
    "MAX_ROW_BYTES",
    "SETTLE_S",
    "Assignment",
    "FunctionTool",
    "InboxCursor",
    "InboxFile",
    "InboxLanding",
    "InboxLinkError",
    "InboxRequest",
    "IngestRun",
    "InputBatch",
    "InputNotSettledError",
    "InputReader",
    "Item",
    "Landing",
    "ResolvedInput",
    "SeedPrompt",
    "SeenIds",
    "ToolFunction",
    "file_sha256",
    "format_validation_error",
    "inspect_inbox_file",
    "iter_inbox_rows",
    "jsonl_items",
    "land_for_any_host",
    "land_inbox",
    "land_input",
    "land_seeds",
    "landed_state",
    "landed_versions",
    "landing_retries",
    "number_spelling",
    "plan_inbox_tick",
    "read_inbox_file",
    "resolve_input",
    "resolve_partition",
    "sanitize_source",
    "scan_inbox",
    "seed_rows",
    "seeds_from_rows",
    "sha256_of",
    "short_hash",
    "still_changing",
    "wait_until_settled",
]
