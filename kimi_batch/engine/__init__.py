"""The batch engine: digest, slot warming, the runner and its ledger (no Dagster here)."""

from kimi_batch.engine.deadline import DeadlinePolicy
from kimi_batch.engine.digest import DigestLintError, SystemDigest, lint_digest, load_digest
from kimi_batch.engine.ledger import Lease, LeaseHeldError, Ledger
from kimi_batch.engine.prompt import assemble_messages
from kimi_batch.engine.requests import GenerationRequest, GenerationResult, SamplingParams
from kimi_batch.engine.runner import (
    BatchEngine,
    BatchOutcome,
    ClientFactory,
    Endpoint,
    EndpointHungError,
    EnginePolicy,
    FailedRequest,
    PlannedRow,
)
from kimi_batch.engine.stats import BatchStats, ProgressEvent
from kimi_batch.engine.warm import SlotWarmer, WarmupReport
from kimi_batch.engine.watchdog import WatchdogPolicy

__all__ = [
    "BatchEngine",
    "BatchOutcome",
    "BatchStats",
    "ClientFactory",
    "DeadlinePolicy",
    "DigestLintError",
    "Endpoint",
    "EndpointHungError",
    "EnginePolicy",
    "FailedRequest",
    "GenerationRequest",
    "GenerationResult",
    "Lease",
    "LeaseHeldError",
    "Ledger",
    "PlannedRow",
    "ProgressEvent",
    "SamplingParams",
    "SlotWarmer",
    "SystemDigest",
    "WarmupReport",
    "WatchdogPolicy",
    "assemble_messages",
    "lint_digest",
    "load_digest",
]
