"""Where each `distilled_responses` partition stands, read from the Dagster instance.

Shared by `kimi-batch status` and the morning alerts, so both name a partition's state the same
way: the state comes from the latest run that distilled it (running, stopped at the nightly
window, failed), else from its materializations (done), else it is pending.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

import dagster as dg
from pydantic import BaseModel, ConfigDict

from kimi_batch.defs.jobs import DISTILLED_RESPONSES, STOPPED_TAG
from kimi_batch.engine import ProgressEvent

__all__ = [
    "ACTIVE_RUN_STATUSES",
    "PARTITION_TAG",
    "STOPPED_AT_WINDOW_TAG",
    "PartitionRecord",
    "PartitionState",
    "distill_states",
    "run_progress",
]

PARTITION_TAG = "dagster/partition"
# "true" on a run that the end of the nightly window stopped before it was done.
STOPPED_AT_WINDOW_TAG = STOPPED_TAG
RUN_SCAN_LIMIT = 2000
_UPSTREAM = (dg.AssetKey("seed_prompts"), dg.AssetKey("amplified_prompts"))
ACTIVE_RUN_STATUSES = frozenset(
    {
        dg.DagsterRunStatus.QUEUED,
        dg.DagsterRunStatus.NOT_STARTED,
        dg.DagsterRunStatus.STARTING,
        dg.DagsterRunStatus.STARTED,
        dg.DagsterRunStatus.CANCELING,
    }
)
_FAILED = frozenset({dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED})


class PartitionState(StrEnum):
    DONE = "done"
    PENDING = "pending"
    RUNNING = "running"
    FAILED = "failed"
    STOPPED_AT_WINDOW = "stopped_at_window"


class PartitionRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str
    state: PartitionState
    run_id: str | None = None


def _state_of(run: dg.DagsterRun, done: set[str], key: str) -> PartitionState | None:
    if run.status in ACTIVE_RUN_STATUSES:
        return PartitionState.RUNNING
    if run.tags.get(STOPPED_AT_WINDOW_TAG) == "true":
        return PartitionState.STOPPED_AT_WINDOW
    if run.status in _FAILED:
        return PartitionState.FAILED
    return PartitionState.DONE if key in done else None


def distill_states(
    instance: dg.DagsterInstance, known_keys: Iterable[str] = ()
) -> dict[str, PartitionRecord]:
    """Every partition the instance or `known_keys` (e.g. the inbox's) mentions, by key."""
    done = set(instance.get_materialized_partitions(DISTILLED_RESPONSES))
    # A run that was to distill a partition logs a planned materialization of it, whatever
    # launched it (a job, the Materialize button, a backfill): newest first, the first record of
    # a partition is its latest attempt.
    planned = instance.fetch_planned_materializations(
        dg.AssetRecordsFilter(asset_key=DISTILLED_RESPONSES), limit=RUN_SCAN_LIMIT
    ).records
    latest: dict[str, str] = {}
    for record in planned:
        if record.partition_key is not None:
            latest.setdefault(record.partition_key, record.run_id)
    run_ids = sorted(set(latest.values()))
    runs = (
        {run.run_id: run for run in instance.get_runs(filters=dg.RunsFilter(run_ids=run_ids))}
        if run_ids
        else {}
    )
    records: dict[str, PartitionRecord] = {}
    for key, run_id in latest.items():
        run = runs.get(run_id)
        state = _state_of(run, done, key) if run is not None else None
        if state == PartitionState.RUNNING and _materialized_by(instance, key, run_id):
            # The run is still going (its checks, say), but this partition is written.
            state = PartitionState.DONE
        if state is not None:
            records[key] = PartitionRecord(key=key, state=state, run_id=run_id)
    expected = set(known_keys) | done
    for asset in _UPSTREAM:
        expected |= set(instance.get_materialized_partitions(asset))
    for key in expected - set(records):
        state = PartitionState.DONE if key in done else PartitionState.PENDING
        records[key] = PartitionRecord(key=key, state=state)
    return dict(sorted(records.items()))


def _materialized_by(instance: dg.DagsterInstance, key: str, run_id: str) -> bool:
    found = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=DISTILLED_RESPONSES, asset_partitions=[key]), limit=1
    ).records
    return bool(found) and found[0].run_id == run_id


def run_progress(instance: dg.DagsterInstance, run_id: str) -> ProgressEvent | None:
    """The last progress line a run logged (rows done/total of its last batch), if any."""
    latest: ProgressEvent | None = None
    for entry in instance.all_logs(run_id):
        if entry.is_dagster_event or not entry.user_message:
            continue
        latest = ProgressEvent.from_line(entry.user_message) or latest
    return latest
