"""Which batch partitions' asset checks failed last: too many cut-off answers, contamination.

A failed check does not fail its run (the rows landed), so nothing else would tell the morning
about it: the freshness alert names these partitions. The state is Dagster's own per-partition
check status, newest evaluation wins.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import dagster as dg

from kimi_batch.pipeline import (
    CONTAMINATION_CHECK,
    STAGE_DECLARATIONS,
    TRUNCATION_CHECK,
    FailedCheck,
)

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
