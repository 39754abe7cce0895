"""llama-server: typed client, server spec and the resident-server manager (no Dagster here).

Errors: see `kimi_batch.llama.exceptions` for the whole tree.
"""

from kimi_batch.llama.client import LlamaClient, RetryPolicy
from kimi_batch.llama.exceptions import LlamaError, ServerSpawnError, SpecMismatchError
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
    "LlamaError",
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
]
