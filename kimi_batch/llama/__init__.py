"""llama-server: typed client, server spec and the resident-server manager (no Dagster here).

The layers above import from here, never from the modules: `client` (the HTTP API), `messages`
(what is sent), `responses` (what comes back), `server`, `binary` and `factory` (the resident
server), `exceptions` (the error tree, rooted in `kimi_batch.errors.KimiBatchError`).
"""

from kimi_batch.llama.client import LlamaClient, RetryPolicy
from kimi_batch.llama.exceptions import (
    LlamaConnectionError,
    LlamaError,
    LlamaHTTPError,
    LlamaLoadingError,
    LlamaRequestError,
    LlamaResponseError,
    LlamaServerError,
    LlamaTimeoutError,
    LlamaUnsupportedError,
    ServerSpawnError,
    SpecMismatchError,
)
from kimi_batch.llama.factory import server_from_settings
from kimi_batch.llama.messages import ChatMessage
from kimi_batch.llama.responses import (
    ChatCompletion,
    GenerationStats,
    HealthState,
    ServerProps,
    TokenLogprob,
    TopLogprob,
)
from kimi_batch.llama.server import (
    AttachedServer,
    ResidentServer,
    ServerHandle,
    ServerSpec,
    ServerStatus,
)

__all__ = [
    "AttachedServer",
    "ChatCompletion",
    "ChatMessage",
    "GenerationStats",
    "HealthState",
    "LlamaClient",
    "LlamaConnectionError",
    "LlamaError",
    "LlamaHTTPError",
    "LlamaLoadingError",
    "LlamaRequestError",
    "LlamaResponseError",
    "LlamaServerError",
    "LlamaTimeoutError",
    "LlamaUnsupportedError",
    "ResidentServer",
    "RetryPolicy",
    "ServerHandle",
    "ServerProps",
    "ServerSpawnError",
    "ServerSpec",
    "ServerStatus",
    "SpecMismatchError",
    "TokenLogprob",
    "TopLogprob",
    "server_from_settings",
]
