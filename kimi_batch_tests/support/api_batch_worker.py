"""A run worker of its own process answering one Batch API batch, for the several-workers test:
the batch's partition of `api_batch_responses` materialized as a Dagster run does it, on this
process's own state dir and the state the deployment shares (PostgreSQL, the warehouse).

    python -m kimi_batch_tests.support.api_batch_worker BATCH_ID [STALL_AFTER]

The environment names the state (KIMI_BATCH_HOME, KIMI_BATCH_DATABASE_URL, KIMI_BATCH_WAREHOUSE)
and the server to attach to (KIMI_BATCH_LLAMA_URL). The partition lease lives `TTL_S` here (60 s
in a deployment), so a killed worker's batch is taken over within a test. With STALL_AFTER, the
worker hangs (`stalled` on stdout) once it has committed that many answers, its lease still
renewed by its heartbeat, until the test kills it. At the end it prints the run's
materialization metadata as one JSON line.
"""

from __future__ import annotations

import json
import sys
import time

import dagster as dg

import kimi_batch.pipeline.driver as lease_module
from kimi_batch.definitions import build_resources
from kimi_batch.defs.assets.api_batch import api_batch_responses
from kimi_batch.defs.partitions import API_BATCH_PARTITIONS_NAME
from kimi_batch.engine import GenerationResult, Ledger
from kimi_batch.settings import Settings

TTL_S = 2.0


def _stall_after(count: int) -> None:
    """Hang the worker once `count` answers are committed (the ledger's put comes first)."""
    put = Ledger.put
    committed = 0

    def stalling_put(self: Ledger, result: GenerationResult) -> bool:
        nonlocal committed
        added = put(self, result)
        committed += 1
        if committed == count:
            print("stalled", flush=True)
            time.sleep(3600)  # the event loop stops here; the lease's heartbeat thread goes on
        return added

    Ledger.put = stalling_put  # type: ignore[method-assign]


def _work(batch_id: str) -> None:
    lease_module.LEASE_TTL_S = TTL_S
    lease_module.LEASE_WAIT_S = 300.0
    settings = Settings.from_env()
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(API_BATCH_PARTITIONS_NAME, [batch_id])
        result = dg.materialize(
            [api_batch_responses],
            partition_key=batch_id,
            resources=build_resources(settings),
            instance=instance,
            raise_on_error=False,
        )
        if not result.success:
            print("failed", flush=True)
            sys.exit(1)
        (done,) = result.asset_materializations_for_node("api_batch_responses")
    # The figures the test reads; the column schema (a TableSchema record) is not JSON.
    metadata = {
        key: value.value
        for key, value in done.metadata.items()
        if isinstance(value.value, str | int | float | bool | None)
    }
    print(json.dumps(metadata, default=str), flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 2:
        _stall_after(int(sys.argv[2]))
    _work(sys.argv[1])
