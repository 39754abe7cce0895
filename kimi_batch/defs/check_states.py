"""Which batch partitions' asset checks failed last: unpublished tables, too many cut-off answers.

A failed check does not fail its run (the Parquet landed), so nothing else would tell the morning
about it: the freshness alert names these partitions and the Trino catch-up sensor republishes the
unpublished ones. The state is Dagster's own per-partition check status, newest evaluation wins.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import dagster as dg
from dagster._core.event_api import PartitionKeyFilter
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus
from pydantic import BaseModel, ConfigDict

__all__ = [
    "PUBLISHED_CHECK",
    "PUBLISHED_CHECKS",
    "TRUNCATION_CHECK",
    "WATCHED_CHECKS",
    "FailedCheck",
    "failed_checks",
]

PUBLISHED_CHECK = "published_to_trino"
TRUNCATION_CHECK = "truncation_rate"
_BATCH_ASSETS = ("seed_prompts", "amplified_prompts", "distilled_responses")
PUBLISHED_CHECKS = tuple(dg.AssetCheckKey(dg.AssetKey(a), PUBLISHED_CHECK) for a in _BATCH_ASSETS)
WATCHED_CHECKS = (
    *PUBLISHED_CHECKS,
    *(dg.AssetCheckKey(dg.AssetKey(a), TRUNCATION_CHECK) for a in _BATCH_ASSETS[1:]),
)


class FailedCheck(BaseModel):
    """The latest evaluation of one check on one partition failed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    partition: str
    asset: str
    check: str
    reason: str

    def describe(self) -> str:
        what = "not published to Trino" if self.check == PUBLISHED_CHECK else self.check
        return f"{self.asset} {what}" + (f" ({self.reason})" if self.reason else "")


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
    keys: Sequence[dg.AssetCheckKey] = WATCHED_CHECKS,
) -> list[FailedCheck]:
    """Checks whose latest evaluation on a partition failed (all partitions, or `partitions`)."""
    wanted = None if partitions is None else list(partitions)
    if wanted == []:
        return []
    storage = instance.event_log_storage
    infos = storage.get_asset_check_partition_info(list(keys), partition_keys=wanted)
    failed: list[FailedCheck] = []
    for info in infos:
        if info.partition_key is None:
            continue
        if info.latest_execution_status != AssetCheckExecutionRecordStatus.FAILED:
            continue
        record = storage.get_latest_asset_check_execution_by_key(
            [info.check_key], partition_filter=PartitionKeyFilter(key=info.partition_key)
        ).get(info.check_key)
        failed.append(
            FailedCheck(
                partition=info.partition_key,
                asset=info.check_key.asset_key.to_user_string(),
                check=info.check_key.name,
                reason=_reason(record.evaluation if record else None),
            )
        )
    return sorted(failed, key=lambda item: (item.partition, item.asset, item.check))
