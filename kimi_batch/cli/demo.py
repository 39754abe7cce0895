"""`kimi-batch demo`: the whole pipeline once, on a real Dagster instance under the state dir."""

from __future__ import annotations

import os
import shutil
import sys
from typing import Any

import dagster as dg

from kimi_batch.definitions import DIGEST_ASSETS, batch_assets, build_resources
from kimi_batch.defs.partitions import DATE_DIMENSION, SOURCE_DIMENSION, SOURCE_PARTITIONS_NAME
from kimi_batch.defs.resources import DigestResource
from kimi_batch.engine import ProgressEvent, notify
from kimi_batch.errors import MissingInputError
from kimi_batch.inputs import Assignment, Landing, inspect_inbox_file, wait_until_settled
from kimi_batch.llama import server_from_settings
from kimi_batch.paths import PRIVATE_FILE_MODE, private_dir
from kimi_batch.pipeline import STAGE_DECLARATIONS
from kimi_batch.settings import Settings, samples_dir

DIGEST_LABEL = "digest: prefill once, restore into every slot"
# The instance settings the demo writes into a Dagster home that has none: telemetry off, so a
# newcomer's first screen is the pipeline's, not Dagster's telemetry banner. `make dev` copies the
# repository's dagster.yaml (telemetry off as well, plus the run queue and pools) over it.
DEMO_INSTANCE_YAML = """\
# Written by `kimi-batch demo`; the repository's dagster.yaml (make dev) replaces it.
telemetry:
  enabled: false
"""


def _console_config(log_level: str) -> dict[str, Any]:
    """Progress lines (rows done, tok/s, ETA) are INFO; Dagster's step events are DEBUG noise.

    Under a terminal progress bar the console shows warnings only: the bar says the rest.
    """
    return {"loggers": {"console": {"config": {"log_level": log_level}}}}


def _phase(label: str, done: int) -> ProgressEvent:
    return ProgressEvent(
        done=done,
        total=1,
        failed=0,
        completion_tokens_per_s=0.0,
        elapsed_s=0.0,
        eta_s=None,
        label=label,
    )


def _seed_inbox(settings: Settings) -> None:
    """An empty inbox gets the shipped sample inputs, so a new user sees a full run: the inbox
    made owner-only when the demo creates it (one a team set up keeps its modes), each sample
    0600 with its own modification time (so it counts as settled at once)."""
    inbox = settings.paths.inbox_dir
    if not inbox.is_dir():
        private_dir(inbox)
    if any(inbox.iterdir()):
        return
    for sample in sorted(samples_dir().iterdir()):
        if sample.is_file():
            target = os.open(
                inbox / sample.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE_MODE
            )
            with sample.open("rb") as source, os.fdopen(target, "wb") as copy:
                shutil.copyfileobj(source, copy)
            shipped = sample.stat()
            os.utime(inbox / sample.name, ns=(shipped.st_atime_ns, shipped.st_mtime_ns))


def _settled(settings: Settings, landing: Landing, assignment: Assignment) -> bool:
    """False for a file still being written that has no earlier landed version: the demo skips
    it (a later run lands it whole) instead of failing or landing half of it."""
    item = inspect_inbox_file(settings.paths.inbox_dir, assignment.name)
    if item is None or item.refused or landing.current(assignment.ds, assignment.source):
        return True
    if wait_until_settled(item.path, (item.size, item.mtime_ns)):
        return True
    print(
        f"kimi-batch demo: {assignment.name} is still being written; skipped "
        "(a later run lands it once it has stopped changing)",
        file=sys.stderr,
    )
    return False


def _preflight(settings: Settings) -> None:
    """What the first asset would fail on, checked before Dagster logs a run: one clear error."""
    DigestResource(deployment=settings).load()  # DigestLintError: cache-breaking content
    server_from_settings(settings)  # ServerSpawnError: no model file, no llama-server binary


def demo_instance(settings: Settings) -> dg.DagsterInstance:
    """The user's instance (`DAGSTER_HOME`), else the state dir's, with its settings written once."""
    if os.environ.get("DAGSTER_HOME"):
        return dg.DagsterInstance.get()
    home = settings.paths.dagster_home
    home.mkdir(parents=True, exist_ok=True)
    config = home / "dagster.yaml"
    if not config.exists():
        config.write_text(DEMO_INSTANCE_YAML)
    return dg.DagsterInstance.from_config(str(home))


def _metadata(result: dg.ExecuteInProcessResult, asset: str) -> dict[str, Any]:
    materializations = result.asset_materializations_for_node(asset)
    if not materializations:
        return {}
    return {key: value.value for key, value in materializations[-1].metadata.items()}


def _inbox_files(settings: Settings) -> list[Assignment]:
    """The inbox's settled files with their partitions (the samples seeded into an empty one)."""
    _seed_inbox(settings)
    with Landing(settings.paths) as landing:
        assigned = landing.assign_inbox(
            settings.paths.inbox_dir,
            arrived=settings.today(),
            start=settings.first_partition_date(),
        )
        files = [item for item in assigned if _settled(settings, landing, item)]
    if not files:
        raise MissingInputError(f"no input files in {settings.paths.inbox_dir}")
    return files


def run_demo(settings: Settings, *, console_log_level: str = "INFO") -> dict[str, Any]:
    """Digest, prefill, then every inbox partition; returns the summary the CLI prints.

    Progress goes to `kimi_batch.engine.progress` listeners as well as to the run logs.
    """
    quiet = _console_config(console_log_level)
    _preflight(settings)
    files = _inbox_files(settings)
    resources = build_resources(settings)
    assets = batch_assets(settings)
    instance = demo_instance(settings)
    instance.add_dynamic_partitions(SOURCE_PARTITIONS_NAME, sorted({f.source for f in files}))

    notify(_phase(DIGEST_LABEL, 0))
    digest_run = dg.materialize(
        DIGEST_ASSETS, resources=resources, instance=instance, run_config=quiet
    )
    notify(_phase(DIGEST_LABEL, 1))
    prefill = _metadata(digest_run, "digest_prefill")
    stages = [d for d in STAGE_DECLARATIONS.values() if d.enabled(settings)]
    rows = dict.fromkeys((d.table for d in stages), 0)
    totals = {"completion_tokens": 0, "quarantined": 0}
    wall_s = 0.0
    cache_ratios: list[float] = []
    for file in files:
        key = dg.MultiPartitionKey({DATE_DIMENSION: file.ds, SOURCE_DIMENSION: file.source})
        run = dg.materialize(
            assets,
            partition_key=key,
            resources=resources,
            instance=instance,
            run_config=quiet,
        )
        for stage in stages:
            meta = _metadata(run, stage.asset)
            rows[stage.table] += int(meta.get("rows", 0))
            totals["completion_tokens"] += int(meta.get("completion_tokens", 0))
            totals["quarantined"] += int(meta.get("quarantined", 0))
            wall_s += float(meta.get("wall_s", 0.0))
            if meta.get("generated", 0):
                cache_ratios.append(float(meta["cache_hit_ratio"]))
    return {
        # rows_amplified, rows_distilled, and one such count per stage declared besides.
        **{f"rows_{table}": count for table, count in rows.items()},
        "rows_quarantined": totals["quarantined"],
        "partitions": len(files),
        "tokens_per_second": round(totals["completion_tokens"] / wall_s, 2) if wall_s else 0.0,
        "cache_hit_ratio": round(min(cache_ratios), 4) if cache_ratios else 1.0,
        "digest_prefills": prefill.get("prefills"),
        "digest_restores": prefill.get("restores"),
        "warehouse": settings.paths.warehouse_location,
    }
