"""The night's tag: once a night's partitions landed, each table's current snapshot is tagged
`night-YYYY-MM-DD` (`warehouse.tag_night`), the night being the run's `kimi_batch/night` tag
(the day that just ended when the schedule fired), or for a night started by hand the newest day
among its partitions. A re-run night moves the tag to its own snapshots.

A tag that cannot be committed does not fail the night (its partitions are written and
materialized already): it is logged, and the next run of the night tags again.
"""

from __future__ import annotations

from collections.abc import Sequence

import dagster as dg

from kimi_batch.defs.schedules import NIGHT_TAG
from kimi_batch.pipeline import split_partition_key
from kimi_batch.storage import StorageError
from kimi_batch.warehouse import Warehouse, night_tag, tag_night


def night_of(context: dg.OpExecutionContext, partitions: Sequence[str]) -> str | None:
    """The night's day: the run's night tag, else the newest day among its partition keys."""
    night = context.run.tags.get(NIGHT_TAG)
    if night:
        return night
    days = [parts[0] for key in partitions if (parts := split_partition_key(key))]
    return max(days, default=None)


def tag_the_night(
    context: dg.OpExecutionContext, warehouse: Warehouse, partitions: Sequence[str]
) -> dict[str, int]:
    """Tag each table's current snapshot with the night's tag: table -> snapshot tagged."""
    night = night_of(context, partitions)
    if night is None:
        return {}
    try:
        tagged = tag_night(warehouse, night)
    except (StorageError, OSError, ValueError) as error:
        context.log.warning(f"the tables were not tagged {night_tag(night)}: {error}")
        return {}
    listed = ", ".join(f"{table}@{snapshot}" for table, snapshot in sorted(tagged.items()))
    context.log.info(f"tagged {night_tag(night)}: {listed or 'no table yet'}")
    return tagged
