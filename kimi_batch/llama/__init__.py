"""llama-server: typed client, server spec and the resident-server manager (no Dagster here).

The layers above import from here, never from the modules: `client` (the HTTP API), `messages`
(what is sent), `responses` (the answers that come back), `server_state` (what the server says
about itself), `chat_stream` (a streamed answer rebuilt into one response), `spec` (what runs),
`server`, `process`, `binary`, `exits` and `factory` (the resident server, its process, and how
a server process ended), `smoke` (the setup's smoke test of the binary), `memory` (will the
model fit), `flags` (llama-server's flags as its parser reads them), `urls` (credentials in a
server URL), `exceptions` (the error tree, rooted in `kimi_batch.errors.KimiBatchError`).
"""

from kimi_batch.llama.affinity import (
    CpuListError,
    format_cpu_list,
    parse_cpu_list,
    pin_to_the_rest,
    the_rest,
)
from kimi_batch.llama.binary import find_tool
from kimi_batch.llama.client import LlamaClient, RetryPolicy
from kimi_batch.llama.exceptions import (
    LlamaBodyTooLargeError,
    LlamaConnectionError,
    LlamaError,
    LlamaFeatureError,
    LlamaHTTPError,
    LlamaLoadingError,
    LlamaRequestError,
    LlamaResponseError,
    LlamaServerError,
    LlamaTimeoutError,
    LlamaUnsupportedError,
    ServerKilledError,
    ServerSpawnError,
    SpecMismatchError,
)
from kimi_batch.llama.factory import (
    server_cpus,
    server_from_settings,
    smoke_from_settings,
    watched_server,
)
from kimi_batch.llama.memory import (
    InsufficientMemoryError,
    MemoryEstimate,
    ModelShape,
    check_memory,
    estimate_memory,
    read_model_shape,
)
from kimi_batch.llama.messages import ChatExtras, ChatMessage, chat_body, completion_body
from kimi_batch.llama.process import ProcessStat, process_stat
from kimi_batch.llama.responses import (
    ChatCompletion,
    GenerationStats,
    TokenLogprob,
    ToolCall,
    TopLogprob,
)
from kimi_batch.llama.server import (
    AttachedServer,
    ResidentServer,
    ServerHandle,
    ServerSpec,
    ServerStatus,
)
from kimi_batch.llama.server_state import HealthState, ServerProps
from kimi_batch.llama.smoke import SmokeResult
from kimi_batch.llama.spec import available_cpus

__all__ = [
    "AttachedServer",
    "ChatCompletion",
    "ChatExtras",
    "ChatMessage",
    "CpuListError",
    "GenerationStats",
    "HealthState",
    "InsufficientMemoryError",
    "LlamaBodyTooLargeError",
    "LlamaClient",
    "LlamaConnectionError",
    "LlamaError",
    "LlamaFeatureError",
    "LlamaHTTPError",
    "LlamaLoadingError",
    "LlamaRequestError",
    "LlamaResponseError",
    "LlamaServerError",
    "LlamaTimeoutError",
    "LlamaUnsupportedError",
    "MemoryEstimate",
    "ModelShape",
    "ProcessStat",
    "ResidentServer",
    "RetryPolicy",
    "ServerHandle",
    "ServerKilledError",
    "ServerProps",
    "ServerSpawnError",
    "ServerSpec",
    "ServerStatus",
    "SmokeResult",
    "SpecMismatchError",
    "TokenLogprob",
    "ToolCall",
    "TopLogprob",
    "available_cpus",
    "chat_body",
    "check_memory",
    "completion_body",
    "estimate_memory",
    "find_tool",
    "format_cpu_list",
    "parse_cpu_list",
    "pin_to_the_rest",
    "process_stat",
    "read_model_shape",
    "server_cpus",
    "server_from_settings",
    "smoke_from_settings",
    "the_rest",
    "watched_server",
]
