"""The night's arithmetic, no Dagster: which day just ended, when the nightly window closes, and
which partitions a night asks for.

"Not yet distilled" includes stale: a partition distilled from an older landed version of its
input than the newest (a producer rewrote the file under the same name) is rebuilt; unchanged
requests come from the ledger, so a new version costs only its new rows. Each night asks for every
partition of the landing manifest dated up to the day that just ended whose night's end is
missing: that day's new inputs, and whatever an earlier night failed or stopped at the window, so
one lost night is recovered the next without anyone touching the UI. Inbox files nobody has seen
yet (the sensor was off) are assigned to the day that just ended first.

The night looks at the inbox itself, sensor or not (`known_partitions`): every settled inbox file
is hashed before the night decides, and one whose content is not its partition's newest landed
version is landed as a new version (`inputs.land_inbox`), so a file rewritten under the same
name, or reverted (A -> B -> A lands A again), makes its partition stale and asked for. A file
still changing is not waited for: it is named, and the next tick lands it.

The nightly window (KIMI_BATCH_NIGHT_ENDS, e.g. `07:00`, `window_end`): past it no new request is
dispatched, those in flight finish (`WINDOW_GRACE_S` at most), the partitions done are written and
the run fails naming those that resume next night.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.inputs import SETTLE_S, Assignment, InboxLanding, Landing, land_inbox
from kimi_batch.pipeline.driver import HeldPartition, PartitionResult, split_partition_key
from kimi_batch.quality import rescreen_partitions
from kimi_batch.settings import Settings

# Requests in flight at the window's end are allowed to finish: on the target one answer after a
# long prompt can take most of an hour.
WINDOW_GRACE_S = 3600
_NAMED = 10


class BatchPartition(BaseModel):
    """One (ds, source) batch partition."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ds: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}$")
    source: str = Field(min_length=1)

    @property
    def key(self) -> str:
        """Its `date|source` key, as the orchestrator spells it."""
        return f"{self.ds}|{self.source}"


def local_time(moment: datetime, settings: Settings) -> datetime:
    """`moment` in the settings' zone (a naive time is read as one of that zone)."""
    zone = settings.zone
    return moment.replace(tzinfo=zone) if moment.tzinfo is None else moment.astimezone(zone)


def night_ds(scheduled_time: datetime, settings: Settings) -> str:
    """The day that just ended at `scheduled_time` (a naive time is read in the settings' zone)."""
    return (local_time(scheduled_time, settings).date() - timedelta(days=1)).isoformat()


def window_end(scheduled_time: datetime, settings: Settings) -> datetime | None:
    """The first KIMI_BATCH_NIGHT_ENDS after `scheduled_time`; None without a window.

    An end time in the hour the clocks repeat comes twice, the second maybe the first after; one
    they skip is read with the offset before the jump, and is passed once they jumped over it.
    """
    if settings.night_ends is None:
        return None
    local = local_time(scheduled_time, settings)

    def after(end: datetime) -> bool:
        # After `local` in real time (an hour the clocks repeat reads the same twice on the
        # wall); one the clocks skip, on the wall clock too.
        wall = end.replace(tzinfo=None)
        skipped = end.astimezone(UTC).astimezone(settings.zone).replace(tzinfo=None) != wall
        later_on_the_wall = wall > local.replace(tzinfo=None)
        return end.astimezone(UTC) > local.astimezone(UTC) and (later_on_the_wall or not skipped)

    first = datetime.combine(local.date(), settings.night_ends, tzinfo=settings.zone)
    readings = (
        reading
        for end in (first, first + timedelta(days=1), first + timedelta(days=2))
        for reading in (end, end.replace(fold=1))
    )
    return next(reading for reading in readings if after(reading))


def nightly_partitions(
    assignments: Iterable[Assignment],
    distilled: Iterable[str],
    night: str,
    stale: Iterable[str] = (),
) -> list[BatchPartition]:
    """Partitions dated up to `night` whose distillation is missing or stale, oldest first.

    `distilled` holds the night's end's partition keys (`ds|source`) materialized; `stale` those
    of them distilled from an older version of their input than the newest landed.
    """
    done: set[tuple[str, str]] = set()
    rebuild = set(stale)
    for raw in (key for key in distilled if key not in rebuild):
        parts = split_partition_key(raw)
        if parts is not None:
            done.add(parts)
    wanted = {
        (item.ds, item.source)
        for item in assignments
        if item.ds <= night and (item.ds, item.source) not in done
    }
    return [BatchPartition(ds=ds, source=source) for ds, source in sorted(wanted)]


def known_partitions(
    settings: Settings, night: str, accept_ds: Callable[[str], bool], settle_s: float = SETTLE_S
) -> tuple[list[Assignment], dict[str, str], InboxLanding]:
    """The manifest's partitions, after assigning inbox files nobody has seen to `night` and
    landing every settled file that changed; the sha256 of each one's newest landed version by
    partition key; and what the look at the inbox landed or left for later."""
    with Landing(settings.paths) as landing:
        inbox = land_inbox(
            landing,
            settings.paths.inbox_dir,
            max_bytes=settings.max_input_bytes,
            arrived=date.fromisoformat(night),
            start=settings.first_partition_date(),
            accept_ds=accept_ds,
            settle_s=settle_s,
        )
        assignments = landing.assignments()
        versions = {
            BatchPartition(ds=a.ds, source=a.source).key: landing.current(a.ds, a.source)
            for a in assignments
        }
    landed = {key: v.sha256 for key, v in versions.items() if v is not None}
    return assignments, landed, inbox


def _named(names: Sequence[str]) -> str:
    more = f" and {len(names) - _NAMED} more" if len(names) > _NAMED else ""
    return ", ".join(names[:_NAMED]) + more


def log_inbox(log: logging.Logger, inbox: InboxLanding) -> str:
    """Log what the look at the inbox did; the sentence naming the files still changing."""
    if inbox.landed:
        log.info(
            f"landed {len(inbox.landed)} new input version(s): "
            + _named([f"{v.name} ({v.sha256[:12]})" for v in inbox.landed])
        )
    for problem in inbox.problems:
        log.warning(f"inbox file not landed: {problem}")
    if inbox.unread:  # the tick's hashing budget ran out: the next tick reads them
        log.info(f"not read yet, looked at by the next tick: {_named(inbox.unread)}")
    if not inbox.settling:
        return ""
    settling = f"still changing, landed by the next tick: {_named(inbox.settling)}"
    log.info(settling)
    return settling


def rescreen_due(settings: Settings, distilled: Iterable[str]) -> list[str]:
    """Distilled partitions holding repeats of a row that left the duplicate index (its own
    partition rebuilt without it): landed again, their set-aside rows are screened again."""
    done = set(distilled)
    marked = (f"{ds}|{source}" for ds, source in rescreen_partitions(settings.paths.dedup_state))
    return [key for key in marked if key in done]


@dataclass
class NightPartitions:
    """The night's partitions still going on, and why the others stopped: failed (a reason
    each) or stopped at the window (they resume next night)."""

    going: dict[str, HeldPartition] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    stopped: list[str] = field(default_factory=list)

    def drop(self, key: str, reason: str) -> None:
        self.going.pop(key, None)
        if key in self.stopped:  # failed after all: named once, as failed
            self.stopped.remove(key)
        self.failed[key] = reason

    def take(
        self,
        results: Mapping[str, PartitionResult[Any]],
        reason_of: Callable[[BaseException], str] = str,
    ) -> None:
        """The driver's results: the failed and the stopped partitions are named."""
        for key, result in results.items():
            if result.failed is not None:
                self.drop(key, reason_of(result.failed))
            elif result.stopped is not None:
                self.going.pop(key, None)
                self.stopped.append(key)

    def summary(self, total: int) -> str:
        lines = [f"{total - len(self.failed) - len(self.stopped)} of {total} partitions done"]
        if self.stopped:
            lines.append(
                f"the nightly window ended: {len(self.stopped)} partition(s) resume next night "
                f"({', '.join(self.stopped[:10])})"
            )
        lines += [f"{key}: {reason}" for key, reason in list(self.failed.items())[:20]]
        return "; ".join(lines)
