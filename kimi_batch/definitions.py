"""The one `Definitions` object: assets, checks, jobs, schedule, sensor and resources."""

from __future__ import annotations

import dagster as dg

from kimi_batch.defs.alerts import (
    distilled_by_night_end,
    distilled_freshness_alert,
    run_failure_alert,
)
from kimi_batch.defs.api_sensor import api_batch_sensor
from kimi_batch.defs.assets.api_batch import api_batch_responses
from kimi_batch.defs.assets.batch import amplified_prompts, distilled_responses, seed_prompts
from kimi_batch.defs.assets.digest import digest_prefill, system_digest
from kimi_batch.defs.jobs import api_batch_job, batch_job, distillation_job, ingest_job
from kimi_batch.defs.publishing import trino_catch_up
from kimi_batch.defs.resources.digest import DigestResource
from kimi_batch.defs.resources.llama import LlamaServerResource
from kimi_batch.defs.resources.trino import TrinoResource
from kimi_batch.defs.resources.warehouse import WarehouseResource
from kimi_batch.defs.schedules import nightly_distillation_schedule
from kimi_batch.defs.sensors import inbox_sensor

__all__ = [
    "ALL_ASSETS",
    "API_ASSETS",
    "BATCH_ASSETS",
    "DIGEST_ASSETS",
    "build_definitions",
    "build_resources",
    "defs",
]

DIGEST_ASSETS = [system_digest, digest_prefill]
BATCH_ASSETS = [seed_prompts, amplified_prompts, distilled_responses]
API_ASSETS = [api_batch_responses]
ALL_ASSETS = [*DIGEST_ASSETS, *BATCH_ASSETS, *API_ASSETS]


def build_resources() -> dict[str, dg.ConfigurableResource]:
    """The resources; each reads the deployment's settings (`KIMI_BATCH_*`) when it is used."""
    return {
        "llama": LlamaServerResource(),
        "digest": DigestResource(),
        "warehouse": WarehouseResource(),
        "trino": TrinoResource(),
    }


def build_definitions() -> dg.Definitions:
    return dg.Definitions(
        assets=ALL_ASSETS,
        asset_checks=[distilled_by_night_end],
        jobs=[batch_job, ingest_job, distillation_job, api_batch_job],
        schedules=[nightly_distillation_schedule],
        sensors=[
            inbox_sensor,
            api_batch_sensor,
            run_failure_alert,
            distilled_freshness_alert,
            trino_catch_up,
        ],
        resources=build_resources(),
    )


defs = build_definitions()
