"""The batch engine: digest, slot warming, the runner and its ledger (no Dagster here).

The layers above import from here, never from the modules: `generation` (requests and results),
`digest` and `prompt` (the fixed system prefix), `budget` (what a slot holds), `prepare` and
`warm` (the digest in every slot), `batch_engine`, `outcome`, `deadline` and `watchdog` (every
slot busy, nothing hung), `batch_run` and `submission` (a run that takes more requests while it
runs), `deployment` (the deployment's resident server as a run uses it, and an event loop a
terminated run stops for certain), `speeds` (the measured speeds, kept across runs), `ledger`
(every finished row kept), `stats` (the figures of a batch), `progress` (in-process progress
listeners).
"""

from kimi_batch.engine.batch_engine import BatchEngine
from kimi_batch.engine.batch_run import BatchRun
from kimi_batch.engine.budget import (
    DEFAULT_REMEDY,
    PROMPT_ALLOWANCE_TOKENS,
    ContextTooSmallError,
    SlotFit,
    answer_cap,
    check_fit,
    estimate_tokens,
)
from kimi_batch.engine.deadline import DeadlinePolicy, SpeedTracker
from kimi_batch.engine.deployment import (
    InterruptibleRunner,
    LlamaDeployment,
    interruptible_runner,
    warm_digest,
)
from kimi_batch.engine.digest import DigestLintError, SystemDigest, lint_digest, load_digest
from kimi_batch.engine.generation import (
    GenerationRequest,
    GenerationResult,
    RequestKind,
    SamplingParams,
    row_request_id,
)
from kimi_batch.engine.ledger import Lease, LeaseHeldError, LeaseLostError, Ledger
from kimi_batch.engine.outcome import (
    BatchOutcome,
    ClientFactory,
    Endpoint,
    EnginePolicy,
    FailedRequest,
    PlannedRow,
)
from kimi_batch.engine.prepare import Prepared, prepare
from kimi_batch.engine.progress import ProgressCallback, listening, notify
from kimi_batch.engine.prompt import (
    INSTRUCTIONS_CLOSE,
    INSTRUCTIONS_OPEN,
    assemble_messages,
    fold_instructions,
)
from kimi_batch.engine.send import EndpointHungError
from kimi_batch.engine.speeds import MeasuredSpeeds, SpeedStore
from kimi_batch.engine.stats import BatchStats, ProgressEvent
from kimi_batch.engine.warm import SlotWarmer, WarmupReport
from kimi_batch.engine.watchdog import WatchdogPolicy

__all__ = [
    "DEFAULT_REMEDY",
    "INSTRUCTIONS_CLOSE",
    "INSTRUCTIONS_OPEN",
    "PROMPT_ALLOWANCE_TOKENS",
    "BatchEngine",
    "BatchOutcome",
    "BatchRun",
    "BatchStats",
    "ClientFactory",
    "ContextTooSmallError",
    "DeadlinePolicy",
    "DigestLintError",
    "Endpoint",
    "EndpointHungError",
    "EnginePolicy",
    "FailedRequest",
    "GenerationRequest",
    "GenerationResult",
    "InterruptibleRunner",
    "Lease",
    "LeaseHeldError",
    "LeaseLostError",
    "Ledger",
    "LlamaDeployment",
    "MeasuredSpeeds",
    "PlannedRow",
    "Prepared",
    "ProgressCallback",
    "ProgressEvent",
    "RequestKind",
    "SamplingParams",
    "SlotFit",
    "SlotWarmer",
    "SpeedStore",
    "SpeedTracker",
    "SystemDigest",
    "WarmupReport",
    "WatchdogPolicy",
    "answer_cap",
    "assemble_messages",
    "check_fit",
    "estimate_tokens",
    "fold_instructions",
    "interruptible_runner",
    "lint_digest",
    "listening",
    "load_digest",
    "notify",
    "prepare",
    "row_request_id",
    "warm_digest",
]
