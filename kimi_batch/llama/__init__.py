"""llama-server: typed client, server spec and the resident-server manager (no Dagster here).

Errors: see `kimi_batch.llama.exceptions` for the whole tree.
"""

from kimi_batch.llama.client import LlamaClient, RetryPolicy
from kimi_batch.llama.exceptions import LlamaError, ServerSpawnError, SpecMismatchError
from kimi_batch.llama.models import ChatCompletion, GenerationStats, HealthState, ServerProps
from kimi_batch.llama.server import (
    AttachedServer,
    ResidentServer,
    ServerHandle,
    ServerSpec,
    ServerStatus,
)
from kimi_batch.llama.types import ChatMessage, TokenLogprob, TopLogprob

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
