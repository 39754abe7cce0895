"""What comes in: the inbox (`inbox`: files listed and inspected, never trusted), the readers
(`reader`: one bounded pass over a JSONL, JSON, CSV or Parquet file, OpenAI batch lines among the
JSONL rows; `formats`: the incremental decoders; `raw_rows`: what a row may hold; `tools`: the
function tools a row offers; `seen_ids`: duplicate ids while a file streams), the prompts they
become (`prompts`: `SeedPrompt`, `InputBatch`) and the `seeds` rows and back (`seeds`).

The landed versions of the inbox files (the manifest, the snapshots, the settle wait) are still
in `kimi_batch.storage` beside `storage/landing.py`, which they depend on. Other packages import
from here, never from the modules.
"""

from kimi_batch.inputs.formats import MAX_ROW_BYTES, Item, jsonl_items
from kimi_batch.inputs.inbox import (
    InboxFile,
    InboxLinkError,
    NotRegularFileError,
    file_sha256,
    inspect_inbox_file,
    open_regular,
    sanitize_source,
    scan_inbox,
    sha256_of,
    short_hash,
)
from kimi_batch.inputs.prompts import InputBatch, SeedPrompt, seed_rows, seeds_from_rows
from kimi_batch.inputs.raw_rows import format_validation_error
from kimi_batch.inputs.reader import InputReader, iter_inbox_rows, read_inbox_file
from kimi_batch.inputs.seen_ids import SeenIds
from kimi_batch.inputs.tools import FunctionTool, ToolFunction

__all__ = [
    "MAX_ROW_BYTES",
    "FunctionTool",
    "InboxFile",
    "InboxLinkError",
    "InputBatch",
    "InputReader",
    "Item",
    "NotRegularFileError",
    "SeedPrompt",
    "SeenIds",
    "ToolFunction",
    "file_sha256",
    "format_validation_error",
    "inspect_inbox_file",
    "iter_inbox_rows",
    "jsonl_items",
    "open_regular",
    "read_inbox_file",
    "sanitize_source",
    "scan_inbox",
    "seed_rows",
    "seeds_from_rows",
    "sha256_of",
    "short_hash",
]
