"""Why a partition is left out of a run while the others go on."""

from __future__ import annotations

from kimi_batch.engine import LeaseLostError
from kimi_batch.errors import KimiBatchError


class PartitionSkippedError(KimiBatchError):
    """A partition this run cannot build (its input, its lease): this run leaves it alone, the
    others go on. The Dagster adapter fails the asset's step with it (`dg.Failure`); the night
    names it among the partitions that failed."""


# What leaves one partition out while the others go on (its input, its lease, a write refused).
SKIPPED = (PartitionSkippedError, LeaseLostError, KimiBatchError)


class StageConfigError(KimiBatchError):
    """A stage's run config names what cannot be used (an output model the deployment does not
    allow, a rubric that cannot be read): the run builds nothing."""
