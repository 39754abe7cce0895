"""What every generation step's helpers read of its context, the pool they run in, and the
pipeline's partition skip as the step's failure."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import dagster as dg

from kimi_batch.defs.resources.warehouse import WarehouseResource
from kimi_batch.pipeline import (
    HeldPartition,
    PartitionSkippedError,
    StageConfigError,
    partition_lease,
)

# An asset's step (one partition) or the nightly op's (many): what the helpers read of it.
RunContext = dg.AssetExecutionContext | dg.OpExecutionContext

# The Dagster pool of every step that sends requests to the server (dagster.yaml: limit 1).
LLAMA_POOL = "llama_server"


@contextmanager
def failing_step() -> Iterator[None]:
    """A partition the pipeline skips (`PartitionSkippedError`), or a stage's config it refuses
    (`StageConfigError`), fails the step as Dagster's `Failure`: its message, shown without a
    traceback."""
    try:
        yield
    except (PartitionSkippedError, StageConfigError) as error:
        raise dg.Failure(str(error)) from error


@contextmanager
def step_lease(
    context: RunContext, warehouse: WarehouseResource, ds: str, source: str
) -> Iterator[HeldPartition]:
    """The partition's lease for this run; one it cannot hold, or loses, fails the step."""
    with failing_step(), partition_lease(warehouse.ledger, ds, source, context.run.run_id) as held:
        yield held
