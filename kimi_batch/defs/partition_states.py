"""Where each partition of the night's end (`distilled_responses`, or the last always-on stage
declared after it: `night_end_key`) stands, read from the Dagster instance.

Shared by `kimi-batch status` and the morning alerts, so both name a partition's state the same
way. The base is Dagster's own per-partition status (materialized; a latest attempt with no
materialization after it, whatever launched it, with its run), so a partition's state never
depends on how many runs came after it. A `nightly_job` run covers many partitions from one op,
which Dagster does not plan per partition: its run config names them, and a named partition with
no materialization since the run began is that run's attempt. On top comes what only this project
knows: the run was stopped at the nightly window, or the partition was distilled from an older
version of its input than the latest landed one (stale).

And which partitions' asset checks failed last (`failed_checks`: too many cut-off answers,
contamination). A failed check does not fail its run (the rows landed), so nothing else would
tell the morning about it: the freshness alert names these partitions. The state is Dagster's
own per-partition check status, newest evaluation wins.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import dagster as dg

from kimi_batch.defs.jobs import (
    FAILED_PARTITIONS_TAG,
    NIGHTLY_JOB_NAME,
    NIGHTLY_OP_NAME,
    STOPPED_TAG,
)
from kimi_batch.engine import ProgressEvent
from kimi_batch.pipeline import (
    CONTAMINATION_CHECK,
    STAGE_DECLARATIONS,
    TRUNCATION_CHECK,
    FailedCheck,
    PartitionRecord,
    PartitionState,
    night_end,
    upstream_of,
)

# ---- partition states ---------------------------------------------------------------------------


PARTITION_TAG = "dagster/partition"
# "true" on a run that the end of the nightly window stopped before it was done.
STOPPED_AT_WINDOW_TAG = STOPPED_TAG
# Runs looked up per query (a filter on run ids becomes one SQL IN list).
_RUN_BATCH = 500
# Nightly runs read for their partitions' attempts: a month of nights, and catch-up reruns.
_NIGHT_RUNS = 60
_RECORDS_PAGE = 1000
# The metadata key under which every batch materialization records its input version.
INPUT_SHA_METADATA = "input_sha256"
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


def _failed_in(run: dg.DagsterRun) -> frozenset[str]:
    """The partitions a night stopped at the window names as failed for their own reasons."""
    try:
        found = json.loads(run.tags.get(FAILED_PARTITIONS_TAG, "[]"))
    except ValueError:
        return frozenset()
    return frozenset(str(key) for key in found) if isinstance(found, list) else frozenset()


def _state_of(run: dg.DagsterRun, key: str) -> PartitionState | None:
    if run.status in ACTIVE_RUN_STATUSES:
        return PartitionState.RUNNING
    if run.tags.get(STOPPED_AT_WINDOW_TAG) == "true" and key not in _failed_in(run):
        return PartitionState.STOPPED_AT_WINDOW
    if run.status in _FAILED:
        return PartitionState.FAILED
    return None  # e.g. a run that succeeded without writing it: done or pending below


def _run_records(instance: dg.DagsterInstance, run_ids: Iterable[str]) -> dict[str, dg.RunRecord]:
    ids = sorted(set(run_ids))
    found: dict[str, dg.RunRecord] = {}
    for start in range(0, len(ids), _RUN_BATCH):
        batch = ids[start : start + _RUN_BATCH]
        found.update(
            (record.dagster_run.run_id, record)
            for record in instance.get_run_records(filters=dg.RunsFilter(run_ids=batch))
        )
    return found


def night_partitions(run: dg.DagsterRun) -> list[str]:
    """The partition keys a `nightly_job` run covers (its run config); [] for another run."""
    if run.job_name != NIGHTLY_JOB_NAME:
        return []
    found: Any = run.run_config or {}
    for step in ("ops", NIGHTLY_OP_NAME, "config", "partitions"):
        found = found.get(step) if isinstance(found, dict) else None
    return [str(key) for key in found] if isinstance(found, list) else []


def _began(record: dg.RunRecord) -> float:
    """When the run started (when it was created, for a run not started yet)."""
    return record.start_time or record.create_timestamp.timestamp()


def _night_attempts(instance: dg.DagsterInstance) -> dict[str, tuple[dg.DagsterRun, float]]:
    """Each partition's latest `nightly_job` run (newest first wins) with no distillation since
    that run began, and when it began."""
    latest: dict[str, tuple[dg.DagsterRun, float]] = {}
    night_runs = instance.get_run_records(
        filters=dg.RunsFilter(job_name=NIGHTLY_JOB_NAME), limit=_NIGHT_RUNS
    )
    for record in night_runs:  # newest first
        run = record.dagster_run
        began = _began(record)
        latest.update((key, (run, began)) for key in night_partitions(run) if key not in latest)
    if not latest:
        return {}
    oldest = min(began for _, began in latest.values())
    materialized: dict[str, float] = {}
    records_filter = dg.AssetRecordsFilter(
        asset_key=night_end_key(), asset_partitions=list(latest), after_timestamp=oldest - 1.0
    )
    cursor: str | None = None
    while True:
        page = instance.fetch_materializations(records_filter, limit=_RECORDS_PAGE, cursor=cursor)
        for record in page.records:
            key = record.partition_key
            if key is not None:
                materialized[key] = max(materialized.get(key, 0.0), record.timestamp)
        if not page.has_more:
            break
        cursor = page.cursor
    return {
        key: (run, began)
        for key, (run, began) in latest.items()
        if materialized.get(key, 0.0) < began
    }


def night_end_key() -> dg.AssetKey:
    """The asset whose partitions, built, make the night done for them (`pipeline.night_end`:
    distillation, or the last always-on stage declared after it)."""
    return dg.AssetKey(night_end().asset)


def distilled_input_sha(instance: dg.DagsterInstance, key: str) -> str | None:
    """The input version (sha256) the partition's latest build of the night's end (its
    distillation, unless a stage follows it) was built from."""
    found = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=night_end_key(), asset_partitions=[key]), limit=1
    ).records
    materialization = found[0].asset_materialization if found else None
    if materialization is None:
        return None
    value = materialization.metadata.get(INPUT_SHA_METADATA)
    return str(getattr(value, "value", value)) if value is not None else None


def distill_states(
    instance: dg.DagsterInstance,
    known_keys: Iterable[str] = (),
    landed: Mapping[str, str] | None = None,
) -> dict[str, PartitionRecord]:
    """Every partition the instance or `known_keys` (e.g. the inbox's) mentions, by key.

    `landed` maps a partition key to the sha256 of its newest landed input: a done partition
    distilled from another version is stale.
    """
    end = night_end_key()
    done = set(instance.get_materialized_partitions(end))
    # Dagster's own record of each partition's latest attempt that nothing materialized since
    # (failed, running, stopped): every such partition, however many runs came after it.
    storage = instance.event_log_storage
    attempts = storage.get_latest_asset_partition_materialization_attempts_without_materializations(
        end
    )
    runs = _run_records(instance, (run_id for run_id, _ in attempts.values()))
    latest: dict[str, tuple[dg.DagsterRun, float]] = {}
    for key, (run_id, _) in attempts.items():
        record = runs.get(run_id)
        if record is not None:
            latest[key] = (record.dagster_run, _began(record))
    for key, (run, began) in _night_attempts(instance).items():
        if key not in latest or latest[key][1] < began:
            latest[key] = (run, began)
    records: dict[str, PartitionRecord] = {}
    for key, (run, _) in latest.items():
        state = _state_of(run, key)
        if state is not None:
            records[key] = PartitionRecord(key=key, state=state, run_id=run.run_id)
    expected = set(known_keys) | done
    for asset in upstream_of(end.path[-1]):
        expected |= set(instance.get_materialized_partitions(dg.AssetKey(asset)))
    for key in expected - set(records):
        state = PartitionState.DONE if key in done else PartitionState.PENDING
        current = (landed or {}).get(key)
        if (
            state == PartitionState.DONE
            and current
            and distilled_input_sha(instance, key) != current
        ):
            state = PartitionState.STALE
        records[key] = PartitionRecord(key=key, state=state)
    return dict(sorted(records.items()))


def run_progress(instance: dg.DagsterInstance, run_id: str) -> ProgressEvent | None:
    """The last progress line a run logged (rows done/total of its last batch), if any."""
    latest: ProgressEvent | None = None
    for entry in instance.all_logs(run_id):
        if entry.is_dagster_event or not entry.user_message:
            continue
        latest = ProgressEvent.from_line(entry.user_message) or latest
    return latest


# ---- check states -------------------------------------------------------------------------------


# Failed evaluations read per page while looking for a partition's newest one.
_HISTORY_PAGE = 200


def watched_checks() -> list[dg.AssetCheckKey]:
    """The checks the alerts report: every declared stage's truncation rate and
    the quality-gated stages' benchmark contamination."""
    stages = STAGE_DECLARATIONS.values()
    truncation = [dg.AssetCheckKey(dg.AssetKey(d.asset), TRUNCATION_CHECK) for d in stages]
    contamination = [
        dg.AssetCheckKey(dg.AssetKey(d.asset), CONTAMINATION_CHECK)
        for d in stages
        if d.task.quality_gated
    ]
    return [*truncation, *contamination]


def _reason(record: dg.AssetCheckEvaluation | None) -> str:
    if record is None:
        return ""
    metadata = record.metadata
    for name in ("reason", "rate"):
        if name in metadata:
            return f"{name} {getattr(metadata[name], 'value', metadata[name])}"[:200]
    return ""


def failed_checks(
    instance: dg.DagsterInstance,
    partitions: Iterable[str] | None = None,
    keys: Sequence[dg.AssetCheckKey] | None = None,
) -> list[FailedCheck]:
    """Checks whose latest evaluation on a partition failed (all partitions, or `partitions`),
    of `keys` (default: `watched_checks()`)."""
    wanted = None if partitions is None else list(partitions)
    if wanted == []:
        return []
    storage = instance.event_log_storage
    infos = storage.get_asset_check_partition_info(
        list(keys or watched_checks()), partition_keys=wanted
    )
    failing: dict[dg.AssetCheckKey, set[str]] = {}
    failed_status: Any = None
    for info in infos:
        status = info.latest_execution_status
        # The status enum is not exported by `dagster`: its FAILED member, from its class.
        failed_status = type(status).FAILED
        if info.partition_key is not None and status == failed_status:
            failing.setdefault(info.check_key, set()).add(info.partition_key)
    failed = [
        FailedCheck(
            partition=partition,
            asset=key.asset_key.to_user_string(),
            check=key.name,
            reason=reason,
        )
        for key, partitions_failing in failing.items()
        for partition, reason in _reasons(instance, key, partitions_failing, failed_status).items()
    ]
    return sorted(failed, key=lambda item: (item.partition, item.asset, item.check))


def _reasons(
    instance: dg.DagsterInstance, key: dg.AssetCheckKey, partitions: set[str], failed: Any
) -> dict[str, str]:
    """Each of `partitions`' reason, from its newest failed evaluation of `key` (newest first)."""
    storage = instance.event_log_storage
    reasons: dict[str, str] = {}
    cursor: int | None = None
    while len(reasons) < len(partitions):
        page = storage.get_asset_check_execution_history(
            key, limit=_HISTORY_PAGE, cursor=cursor, status={failed}
        )
        for record in page:
            if record.partition in partitions and record.partition not in reasons:
                reasons[record.partition] = _reason(record.evaluation)
        if len(page) < _HISTORY_PAGE:
            break
        cursor = page[-1].id
    return {partition: reasons.get(partition, "") for partition in partitions}
