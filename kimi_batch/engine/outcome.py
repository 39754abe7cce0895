"""What a batch is given (endpoints, policy) and what it hands back (planned rows, failures,
figures). The results themselves stay in the ledger: `BatchOutcome.iter_results` streams them."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.engine.deadline import DeadlinePolicy
from kimi_batch.engine.generation import GenerationRequest, GenerationResult, SamplingParams
from kimi_batch.engine.ledger import Ledger
from kimi_batch.engine.stats import BatchStats
from kimi_batch.engine.warm import WarmupReport
from kimi_batch.engine.watchdog import WatchdogPolicy
from kimi_batch.llama import LlamaClient
from kimi_batch.settings import DEFAULT_SLOT_SAVES_MAX


class Endpoint(BaseModel):
    """One llama-server the engine may use."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_url: str
    slots: int = Field(ge=1)
    model: str
    ctx: int | None = None
    n_predict: int = Field(default=-1, description="Server cap on generated tokens; -1 none.")
    batch_tokens: int = Field(
        default=2048, ge=1, description="The server's --batch-size (sizes the watchdog's stall)."
    )
    api_key: str | None = Field(default=None, repr=False)
    slot_save_dir: Path | None = Field(
        default=None,
        description="The server's --slot-save-path as this process sees it (the resident "
        "server's): a batch's saves of request digests are removed from there. None: the "
        "server gets none.",
    )


ClientFactory = Callable[[Endpoint], LlamaClient]


def default_client(endpoint: Endpoint) -> LlamaClient:
    return LlamaClient(endpoint.base_url, api_key=endpoint.api_key)


class EnginePolicy(BaseModel):
    """Attempts, backoff, deadlines and hang detection of one engine."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    attempts: int = Field(default=4, ge=1, le=20, description="Sends per request in all.")
    backoff_s: float = Field(default=1.0, ge=0.0, description="Wait before the second send.")
    max_backoff_s: float = Field(default=30.0, ge=0.0)
    load_wait_s: float = Field(
        default=1800.0, gt=0, description="How long a respawned server may take to load."
    )
    deadline: DeadlinePolicy = Field(default_factory=DeadlinePolicy)
    watchdog: WatchdogPolicy = Field(default_factory=WatchdogPolicy)
    slot_saves_max: int = Field(
        default=DEFAULT_SLOT_SAVES_MAX,
        ge=0,
        description="A batch's own slot-save files of request digests at once, per server "
        "(the least recently used is removed first); 0: none, each slot prefills.",
    )

    def delay(self, attempt: int) -> float:
        base = min(self.max_backoff_s, self.backoff_s * (2 ** (attempt - 1)))
        return base * (0.5 + random.random() / 2)


class PlannedRequest(BaseModel):
    """A request with its keys and the params actually sent (clamped)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    request_id: str = Field(description="The output row's id: content key + input id.")
    content_key: str = Field(
        description="Ledger key: hash of digest, model, params, messages (and the sample's "
        "identity when the answer is not determined)."
    )
    request: GenerationRequest
    params: SamplingParams


def distinct(planned: Sequence[PlannedRequest]) -> list[PlannedRequest]:
    """One request per ledger key (a determined answer is generated once, whichever inputs
    ask for it), in first-asked order, each at the lowest rank any of its copies has: a
    request the oldest partition needs goes out with the oldest partition's."""
    unique: dict[str, PlannedRequest] = {}
    for item in planned:
        kept = unique.get(item.content_key)
        if kept is None:
            unique[item.content_key] = item
        elif item.request.priority < kept.request.priority:
            unique[item.content_key] = lower_rank(kept, item.request.priority)
    return list(unique.values())


def lower_rank(item: PlannedRequest, priority: int) -> PlannedRequest:
    """`item` at rank `priority` (a lower one another input asking for it has)."""
    request = item.request.model_copy(update={"priority": priority})
    return item.model_copy(update={"request": request})


class PlannedRow(BaseModel):
    """One output row of the batch, in request order: what to read back from the ledger."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    request_id: str
    content_key: str
    input_id: str
    tag: str
    from_ledger: bool = Field(default=False, description="Finished before this batch began.")


class FailedRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    request_id: str
    input_id: str
    tag: str
    reason: str
    attempts: int


class BatchOutcome(BaseModel):
    """Planned rows, failures and statistics; the results themselves stay in the ledger."""

    model_config = ConfigDict(extra="forbid")

    model: str
    digest_sha256: str
    planned: list[PlannedRow]
    failures: list[FailedRequest]
    stats: BatchStats
    warmups: list[WarmupReport]
    stopped_at_window: bool = Field(
        default=False, description="The stop time passed: `stats.not_started` rows wait."
    )
    not_sent: list[FailedRequest] = Field(
        default_factory=list, description="The rows the stop time left unsent (0 attempts)."
    )

    def iter_results(self, ledger: Ledger, *, chunk_size: int = 256) -> Iterator[GenerationResult]:
        """Finished rows in request order (ledger hits included), `chunk_size` at a time.

        Each row carries its own request/input id and tag, also where two inputs share one
        generation. Rows that failed or were not started are absent.
        """
        rows = iter(self.planned)
        for result in ledger.iter_results(
            (p.content_key for p in self.planned), chunk_size=chunk_size
        ):
            row = next(r for r in rows if r.content_key == result.request_id)
            yield result.model_copy(
                update={"request_id": row.request_id, "input_id": row.input_id, "tag": row.tag}
            )
