"""A run worker of its own process for the several-workers test: what the partition driver does
to a partition, on the state a deployment shares (PostgreSQL, one warehouse), nothing else.

    python -m kimi_batch_tests.support.state_worker SPEC_JSON

For each partition in turn: hold its lease (waiting while another worker holds it), skip it if its
Parquet is already written, else run its requests through the real engine (a rerun sends only
what the ledger lacks), and write the partition under the lease check. Each step is one line on
stdout (`leased P`, `skipped P`, `wrote P generated=N from_ledger=M`), so a test can see which
worker did what. With `stall_after`, the worker hangs (`stalled`) once it has committed that many
rows, its lease still renewed by its heartbeat, as a stuck worker would, until the test kills it.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from kimi_batch.engine import (
    BatchEngine,
    Endpoint,
    GenerationRequest,
    GenerationResult,
    Ledger,
    SamplingParams,
    SystemDigest,
)
from kimi_batch.llama import ChatMessage
from kimi_batch.paths import StateLocation, StatePaths
from kimi_batch.pipeline import DistilledRow, generation_columns
from kimi_batch.warehouse import CatalogSpec, Warehouse

__all__ = ["DS", "WorkerSpec", "partition_requests"]

DS = "2026-11-28"
_PARAMS = SamplingParams(max_tokens=6, temperature=0.0)


class WorkerSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    ledger: StateLocation
    warehouse: Path
    endpoint: Endpoint
    digest: str
    digest_tokens: int
    sources: list[str]
    rows: int
    ttl_s: float
    stall_after: int | None = None


def partition_requests(source: str, rows: int) -> list[GenerationRequest]:
    """The same requests for a partition in every worker (the ledger keys them alike)."""
    return [
        GenerationRequest(
            input_id=f"{source}-{i}",
            messages=[ChatMessage(role="user", content=f"{source}: one word for {i}.")],
            params=_PARAMS,
        )
        for i in range(rows)
    ]


def _say(line: str) -> None:
    print(line, flush=True)


class _StallingLedger(Ledger):
    """The ledger, hanging the worker after `stall_after` rows are committed."""

    def __init__(self, location: StateLocation, stall_after: int | None) -> None:
        super().__init__(location)
        self.stall_after = stall_after
        self.committed = 0

    def put(self, result: GenerationResult) -> bool:
        added = super().put(result)
        self.committed += 1
        if self.committed == self.stall_after:
            _say("stalled")
            time.sleep(3600)  # the event loop stops here; the lease's heartbeat thread goes on
        return added


def _row(result: GenerationResult, prompts: dict[str, str]) -> DistilledRow:
    return DistilledRow.model_validate(
        {
            **generation_columns(result),
            "seed_id": result.input_id,
            "origin": "seed",
            "strategy": None,
            "prompt": prompts[result.input_id],
            "response": result.text,
            "structured": None,
            "logprobs": None,
        }
    )


async def _work(spec: WorkerSpec) -> None:
    # The shared folder's tables, their catalog beside the ledger (in its PostgreSQL).
    shared = StatePaths(
        home=spec.warehouse.parent, warehouse_override=spec.warehouse, database_url=spec.ledger.url
    )
    warehouse = Warehouse(CatalogSpec.from_paths(shared))
    with _StallingLedger(spec.ledger, spec.stall_after) as ledger:
        engine = BatchEngine(
            [spec.endpoint],
            SystemDigest.from_text(spec.digest),
            ledger,
            digest_tokens=spec.digest_tokens,
        )
        for source in spec.sources:
            key = f"{DS}|{source}"
            with ledger.lease(key, spec.name, ttl_s=spec.ttl_s, wait_s=300, poll_s=0.2) as lease:
                _say(f"leased {source}")
                if warehouse.has_partition("distilled", DS, source):
                    _say(f"skipped {source}")
                    continue
                requests = partition_requests(source, spec.rows)
                outcome = await engine.run(requests)
                prompts = {r.input_id: str(r.messages[-1].content) for r in requests}
                rows = [_row(result, prompts) for result in outcome.iter_results(ledger)]
                warehouse.write_partition("distilled", DS, source, rows, guard=lease)
                stats = outcome.stats
                _say(f"wrote {source} generated={stats.generated} from_ledger={stats.from_ledger}")


if __name__ == "__main__":
    asyncio.run(_work(WorkerSpec.model_validate_json(sys.argv[1])))
