"""A stand-in `nightly_job` that fails part of its night, for the readers of a night's outcome
(`kimi-batch status`, the morning alerts): the real job and op names and run config, so
`partition_states` reads its partitions as it reads the real one's."""

import dagster as dg

from kimi_batch.defs.jobs import DISTILLED_RESPONSES, NIGHTLY_JOB_NAME, NIGHTLY_OP_NAME
from kimi_batch.defs.partition_states import INPUT_SHA_METADATA
from kimi_batch.engine.stats import ProgressEvent
from kimi_batch_tests.support.standins import StandinNightConfig

__all__ = ["LOST_REASON", "failing_night_job"]

LOST_REASON = "llama-server went away"


def failing_night_job(
    done: list[str], *, progress: ProgressEvent, input_sha256: str | None = None
) -> dg.JobDefinition:
    """Materializes the partitions in `done` (recording `input_sha256` as the input version they
    consumed, as a real distillation does), logs `progress` and fails naming the others with
    `LOST_REASON`, as the real op words it."""
    metadata = {INPUT_SHA_METADATA: input_sha256} if input_sha256 is not None else None

    @dg.op(name=NIGHTLY_OP_NAME)
    def night_batch(context: dg.OpExecutionContext, config: StandinNightConfig) -> None:
        for key in done:
            context.log_event(
                dg.AssetMaterialization(DISTILLED_RESPONSES, partition=key, metadata=metadata)
            )
        context.log.info(str(progress))
        lost = [key for key in config.partitions if key not in done]
        raise dg.Failure(
            f"{len(done)} of {len(config.partitions)} partitions done; "
            + "; ".join(f"{key}: {LOST_REASON}" for key in lost)
        )

    @dg.job(name=NIGHTLY_JOB_NAME)
    def nightly_job() -> None:
        night_batch()

    return nightly_job
