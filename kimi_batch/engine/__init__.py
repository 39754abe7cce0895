"""The batch engine: digest, slot warming, the runner and its ledger (no Dagster here)."""

from kimi_batch.engine.digest import DigestLintError, SystemDigest, lint_digest, load_digest
from kimi_batch.engine.ledger import Ledger
from kimi_batch.engine.prompt import assemble_messages
from kimi_batch.engine.requests import GenerationRequest, GenerationResult, SamplingParams
from kimi_batch.engine.runner import BatchEngine, BatchOutcome, Endpoint, FailedRequest
from kimi_batch.engine.stats import BatchStats, ProgressEvent
from kimi_batch.engine.warm import SlotWarmer, WarmupReport

__all__ = [
    "BatchEngine",
    "BatchOutcome",
    "BatchStats",
    "DigestLintError",
    "Endpoint",
    "FailedRequest",
    "GenerationRequest",
    "GenerationResult",
    "Ledger",
    "ProgressEvent",
    "SamplingParams",
    "SlotWarmer",
    "SystemDigest",
    "WarmupReport",
    "assemble_messages",
    "lint_digest",
    "load_digest",
]
