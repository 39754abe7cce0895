"""The real jobs, sensor and schedule over small stand-in assets with the real keys and partitions.

Asset jobs are defined by key and need assets to resolve; the sensor/schedule tests test
orchestration, not generation, so the stand-ins only find their inbox file (through the real
`resolve_partition`) and sleep a little in the llama pool. `STANDIN_DEFS` is the same thing as a
code location (`kimi_batch_tests.support.standins:STANDIN_DEFS`).

No `from __future__ import annotations` here: Dagster inspects the stand-in assets' `context`
annotation when they are defined and rejects it as a string.
"""

import os
import time

import dagster as dg

from kimi_batch.defs.assets.stage_asset import partition_parts
from kimi_batch.defs.jobs import (
    BATCH_GROUP,
    DISTILLED_RESPONSES,
    INGEST_TAG,
    LLAMA_TAG,
    NIGHTLY_JOB_NAME,
    NIGHTLY_OP_NAME,
    batch_job,
    distillation_job,
    ingest_job,
)
from kimi_batch.defs.partition_states import INPUT_SHA_METADATA
from kimi_batch.defs.partitions import build_batch_partitions
from kimi_batch.defs.schedules import build_nightly_schedule
from kimi_batch.defs.sensors import build_inbox_sensor
from kimi_batch.inputs.inbox import file_sha256, inspect_inbox_file
from kimi_batch.inputs.landing import Landing
from kimi_batch.inputs.partition_input import resolve_partition
from kimi_batch.pipeline import split_partition_key
from kimi_batch.settings import Settings

__all__ = ["STANDIN_DEFS", "STANDIN_SLEEP_ENV", "StandinNightConfig", "standin_definitions"]

STANDIN_SLEEP_ENV = "KIMI_BATCH_TEST_STANDIN_SLEEP"


def _standin_sleep() -> float:
    return float(os.environ.get(STANDIN_SLEEP_ENV, "0"))


def standin_definitions(settings: Settings | None = None) -> dg.Definitions:
    """The real jobs/sensor/schedule over stand-in assets with the real keys and partitions.

    Built for `settings`, by default the environment's when called (tests set it first).
    """
    settings = settings or Settings.from_env()
    batch_partitions = build_batch_partitions(settings)

    # The real assets' group and ingest tags: the real jobs select by them.
    ingest = {INGEST_TAG: "true"}

    @dg.asset(
        name="seed_prompts", partitions_def=batch_partitions, group_name=BATCH_GROUP, tags=ingest
    )
    def seed_prompts(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        ds, source = partition_parts(context)
        resolved = resolve_partition(settings, ds, source)
        version = resolved.version
        return dg.MaterializeResult(
            metadata={
                "file": resolved.assignment.name,
                "bytes": version.size if version else -1,
                "problem": resolved.problem or "",
            }
        )

    @dg.asset(
        name="amplified_prompts",
        partitions_def=batch_partitions,
        deps=[seed_prompts],
        pool="llama_server",
        group_name=BATCH_GROUP,
        tags=ingest,
    )
    def amplified_prompts() -> dg.MaterializeResult:
        return _pooled_step()

    def consumed(key: str) -> dict[str, str]:
        """The input version a real distillation records: the inbox file's content (its run
        lands it first), else the partition's newest landed version."""
        parts = split_partition_key(key)
        assert parts is not None
        with Landing(settings.paths) as landing:
            assignment = landing.assignment_for(*parts)
            version = landing.current(*parts)
        item = inspect_inbox_file(settings.paths.inbox_dir, assignment.name) if assignment else None
        if item is not None and item.refused is None:
            return {INPUT_SHA_METADATA: file_sha256(item.path)}
        return {INPUT_SHA_METADATA: version.sha256 if version else ""}

    @dg.asset(
        name="distilled_responses",
        partitions_def=batch_partitions,
        deps=[amplified_prompts],
        pool="llama_server",
        group_name=BATCH_GROUP,
    )
    def distilled_responses(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        step = _pooled_step()
        return dg.MaterializeResult(
            metadata={**(step.metadata or {}), **consumed(context.partition_key)}
        )

    @dg.op(name=NIGHTLY_OP_NAME, pool="llama_server")
    def night_batch(context: dg.OpExecutionContext, config: StandinNightConfig) -> None:
        """The night's partitions, each materialized after a pooled sleep."""
        for key in config.partitions:
            _pooled_step()
            context.log_event(
                dg.AssetMaterialization(DISTILLED_RESPONSES, partition=key, metadata=consumed(key))
            )

    @dg.job(name=NIGHTLY_JOB_NAME, tags={LLAMA_TAG: "true"}, executor_def=dg.in_process_executor)
    def nightly_job() -> None:
        night_batch()

    # Steps run in their run's process, as in the real definitions (`build_definitions`): a
    # process per step would load this location again before every step (~5-8 s on 2 cores).
    return dg.Definitions(
        assets=[seed_prompts, amplified_prompts, distilled_responses],
        jobs=[batch_job, ingest_job, distillation_job, nightly_job],
        sensors=[build_inbox_sensor(settings)],
        schedules=[build_nightly_schedule(settings)],
        executor=dg.in_process_executor,
    )


class StandinNightConfig(dg.Config):
    partitions: list[str]


def _pooled_step() -> dg.MaterializeResult:
    started = time.time()
    time.sleep(_standin_sleep())
    return dg.MaterializeResult(metadata={"started": started, "ended": time.time()})


STANDIN_DEFS = standin_definitions()
