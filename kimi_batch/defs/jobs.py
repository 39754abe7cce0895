"""The partitioned jobs: everything, ingestion (the sensor's), distillation of one partition, and
the names of the nightly job (one run over many partitions, `kimi_batch.defs.assets.night`).

Selections name the batch group, an asset tag or asset keys rather than asset objects, so this
module (and the sensor/schedule built on it) imports without the asset modules, and a stage
declared later (`kimi_batch.pipeline.stages`) is selected too; `Definitions` resolves them, and the jobs take the
assets' `batch_partitions` from them (Dagster deprecated passing `partitions_def` here), so
backfills of any job work over date ranges.

All of them run steps of the `llama_server` pool and carry the `kimi_batch/uses_llama_server`
tag: dagster.yaml limits runs with that tag to one at a time in the run queue (so two runs never
share the server's slots), and the pool limit holds llama steps to one at a time even in runs
without the tag.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import dagster as dg

from kimi_batch.pipeline import DISTILL, SEED_ASSET

# The asset group of seed_prompts and every declared stage.
BATCH_GROUP = "batch"
# Asset tag of the stages the inbox sensor's ingest_job runs after landing the seeds.
INGEST_TAG = "kimi_batch/ingest"
# Asset tag of the stages a setting switches on (`switch`): batch_job leaves them out.
OPTIONAL_TAG = "kimi_batch/optional"
# Asset tag of the night's end (`kimi_batch.pipeline.night_end`), set when the assets are built.
NIGHT_END_TAG = "kimi_batch/night_end"
JOB_TAG = "kimi_batch/job"
LLAMA_TAG = "kimi_batch/uses_llama_server"
# When the run's nightly window ends (ISO datetime, set by the nightly schedule or by hand): past it
# the assets send no new request. A run stopped there is tagged STOPPED_TAG=true.
WINDOW_TAG = "kimi_batch/window_ends"
STOPPED_TAG = "kimi_batch/stopped_at_window"
# On a night stopped at the window: the partitions of its run that failed for a reason of their
# own (a JSON list), so that only the others are said to resume next night.
FAILED_PARTITIONS_TAG = "kimi_batch/failed_partitions"
# On a partition's version run: the night run whose partition it versions (the UI shows it).
NIGHT_RUN_TAG = "kimi_batch/night_run"
# Runs nobody watches (sensor, nightly schedule) are retried a bounded number of times (run_retries
# in dagster.yaml), from the failed step: finished requests come from the ledger, so a retry
# repeats no generation. A run stopped at the nightly window is not retried (nothing would be sent).
RETRY_TAGS: dict[str, str] = {"dagster/max_retries": "2", "dagster/retry_strategy": "FROM_FAILURE"}

SEED_PROMPTS = dg.AssetKey(SEED_ASSET)
DISTILLED_RESPONSES = dg.AssetKey(DISTILL.asset)
API_BATCH_RESPONSES = dg.AssetKey("api_batch_responses")
API_BATCH_JOB_NAME = "api_batch_job"
# The nightly schedule's job: every partition of a night in one run (`defs/assets/night.py`).
NIGHTLY_JOB_NAME = "nightly_job"
NIGHTLY_OP_NAME = "night_batch"


def _tags(kind: str) -> dict[str, str]:
    return {JOB_TAG: kind, LLAMA_TAG: "true"}


batch_job = dg.define_asset_job(
    name="batch_job",
    selection=dg.AssetSelection.groups(BATCH_GROUP) - dg.AssetSelection.tag(OPTIONAL_TAG, "true"),
    description="One batch end to end: seed prompts and every stage but those a setting "
    "switches on (the judge).",
    tags=_tags("batch"),
)

ingest_job = dg.define_asset_job(
    name="ingest_job",
    selection=dg.AssetSelection.tag(INGEST_TAG, "true"),
    description="Read a new inbox file and run the stages declared for ingest, amplification "
    "(started by the inbox sensor).",
    tags=_tags("ingest"),
)

# One partition's night (the UI, backfills): the night's end and what it reads. Upstream
# included: a day the sensor never ingested still gets its answers, and a day it did costs no
# generation twice (finished requests come from the ledger). Selected by tag, so a stage declared
# after distillation is the job's end as it is the night's.
distillation_job = dg.define_asset_job(
    name="distillation_job",
    selection=dg.AssetSelection.tag(NIGHT_END_TAG, "true").upstream(),
    description="The night's stages for a partition (teacher answers and what follows them); "
    "upstream steps reuse the ledger.",
    tags=_tags("distillation"),
)

# A Batch API batch: its own partition, queued behind (or before) the nightly runs like any run
# that uses the server; no amplification.
api_batch_job = dg.define_asset_job(
    name=API_BATCH_JOB_NAME,
    selection=dg.AssetSelection.assets(API_BATCH_RESPONSES),
    description="Answers of one Batch API batch (started by the API batch sensor).",
    tags=_tags("api_batch"),
)


def nightly_run_config(partitions: Sequence[str], **config: Any) -> dict[str, Any]:
    """Run config of a `nightly_job` run over `partitions` (keys `date|source`, oldest first);
    `config` adds the night op's other fields (`amplify`, `distillation`, ...)."""
    return {"ops": {NIGHTLY_OP_NAME: {"config": {"partitions": list(partitions), **config}}}}
