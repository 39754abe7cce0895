"""What the morning is told, no Dagster: a failed run's message, and the report on a night at its
deadline (its partitions not done, its failed checks, a Trino that cannot read the tables).

Nobody watches the night, so the Dagster adapter's sensors (`defs/alerts.py`) post these to
`KIMI_BATCH_ALERT_WEBHOOK` (Slack-compatible JSON, `webhook`); without a webhook they are only
logged (`deliver`). What a partition's state is and which checks failed the adapter reads from
the Dagster instance; this module only words them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, time, timedelta
from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from kimi_batch.engine import ProgressEvent
from kimi_batch.pipeline.stages import night_end
from kimi_batch.pipeline.webhook import MAX_TEXT_CHARS, post_message
from kimi_batch.settings import Settings
from kimi_batch.storage import StorageError
from kimi_batch.warehouse import TrinoConfig, TrinoReader

DEFAULT_NIGHT_ENDS = time(7, 0)
# Partition keys a message lists (a nightly run's, an overdue night's); the counts stay exact.
LISTED = 10
# A free text in a message (a step error, a check's reason, the freshness verdict, Trino's
# problem) is cut to this many characters, so the message fits the webhook's MAX_TEXT_CHARS as
# built: cut there instead, it lost its last lines (rows done, the link to the run).
FREE_TEXT_CHARS = 300
# The morning's one Trino query: a count, which a working Trino answers in seconds.
TRINO_PROBE_TIMEOUT_S = 60.0

# A run's last progress line (rows done/total), looked up by run id.
ProgressOf = Callable[[str], ProgressEvent | None]


class PartitionState(StrEnum):
    DONE = "done"
    PENDING = "pending"
    RUNNING = "running"
    FAILED = "failed"
    STOPPED_AT_WINDOW = "stopped_at_window"
    STALE = "stale"


class PartitionRecord(BaseModel):
    """Where one partition of the night's end stands, and the run of its latest attempt."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str
    state: PartitionState
    run_id: str | None = None


class FailedCheck(BaseModel):
    """The latest evaluation of one check on one partition failed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    partition: str
    asset: str
    check: str
    reason: str

    def describe(self) -> str:
        return f"{self.asset} {self.check}" + (f" ({self.reason})" if self.reason else "")


def deliver(log: logging.Logger, settings: Settings, text: str) -> bool:
    """False only when the webhook did not take the message (without a webhook: logged, True)."""
    if not settings.alert_webhook:
        log.info(f"no KIMI_BATCH_ALERT_WEBHOOK; alert not sent:\n{text}")
        return True
    result = post_message(settings.alert_webhook, text)
    if not result.delivered:
        log.warning(f"alert webhook failed ({result.error}); the alert was:\n{text}")
    return result.delivered


def _clip(text: str, limit: int = FREE_TEXT_CHARS) -> str:
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"


def _rows(progress: ProgressEvent | None) -> str:
    if progress is None:
        return "no rows reported"
    return f"{progress.done}/{progress.total} rows done"


def failure_text(
    run_id: str,
    job_name: str,
    partition: str,
    covered: Sequence[str],
    step_errors: Sequence[str],
    progress: ProgressEvent | None,
    dagster_url: str,
) -> str:
    """The alert for one failed run: its `partition` tag, or the partitions a nightly run
    `covered`, its step errors, its last progress line, where to look."""
    where = f"partition: {partition}"
    if covered:  # one nightly run covers the night; its step error names the partitions it lost
        shown = ", ".join(covered[:LISTED])
        more = f" and {len(covered) - LISTED} more" if len(covered) > LISTED else ""
        where = f"partitions: {len(covered)} ({shown}{more})"
    what = "; ".join(_clip(error) for error in step_errors[:3])
    what = what or "the run failed before any step ran"
    return "\n".join(
        [
            f"kimi_batch: run {run_id[:8]} of {job_name} FAILED",
            where,
            f"what failed: {what}",
            f"rows: {_rows(progress)} (finished rows are kept in the ledger; a rerun resumes)",
            f"look: {dagster_url.rstrip('/')}/runs/{run_id} · kimi-batch status",
        ]
    )


class NightReport(BaseModel):
    """Night `ds` at its deadline: the freshness check's verdict, what is not done or failed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ds: str
    deadline: datetime
    fresh: bool
    freshness: str
    expected: list[str]
    stale: list[PartitionRecord]
    failed_checks: list[FailedCheck] = []
    trino: str = ""  # why the configured Trino could not read the tables ("": it could)

    @property
    def passed(self) -> bool:
        return self.fresh and not self.stale and not self.failed_checks and not self.trino


def due_night(now: datetime, night_ends: time | None) -> tuple[str, datetime]:
    """(the day of the last night whose window has ended at `now`, that window's end).

    The night after day D ends on D+1 at `night_ends`; before that time on D+1, the night due is
    the one of D-1. An end time the clocks repeat has come the first time they read it; one they
    skip, once they jumped over it.
    """
    ends = night_ends or DEFAULT_NIGHT_ENDS
    deadline = datetime.combine(now.date(), ends, tzinfo=now.tzinfo)
    # Before it on the wall clock and in real time: two times of one zone compare as wall-clock
    # times, and past the first of two readings a repeated hour reads earlier again.
    if now < deadline and (now.tzinfo is None or now.astimezone(UTC) < deadline.astimezone(UTC)):
        deadline -= timedelta(days=1)
    return (deadline.date() - timedelta(days=1)).isoformat(), deadline


def trino_problem(settings: Settings, ds: str) -> str:
    """Why the deployment's Trino cannot count night `ds`'s `distilled` rows ("" when it can,
    or when no Trino is configured): the readers' outage the morning should hear of."""
    if not settings.trino_host:
        return ""
    config = TrinoConfig.from_settings(settings).model_copy(
        update={"statement_timeout_s": TRINO_PROBE_TIMEOUT_S, "max_attempts": 1}
    )
    try:
        with TrinoReader(config) as reader:
            reader.count("distilled", ds=ds)
    except StorageError as error:
        return str(error)[:300]
    return ""


def _headline(report: NightReport) -> str:
    if not report.fresh:
        return (
            f"kimi_batch: {night_end().asset} is OVERDUE at "
            f"{report.deadline:%Y-%m-%d %H:%M %Z} "
            f"(night {report.ds}): {_clip(report.freshness)}"
        )
    if report.stale:
        return f"kimi_batch: night {report.ds} not distilled by {report.deadline:%Y-%m-%d %H:%M %Z}"
    if not report.failed_checks:
        return f"kimi_batch: night {report.ds} distilled, but Trino cannot read the tables"
    return f"kimi_batch: night {report.ds} distilled, but checks failed"


def night_message(report: NightReport, progress_of: ProgressOf, dagster_url: str) -> str:
    """The morning message of a night that was overdue, left partitions or failed checks."""
    lines = [_headline(report)]
    if report.stale:
        lines.append(f"{len(report.stale)} of {len(report.expected)} partition(s) not done:")
    for record in report.stale[:LISTED]:
        detail = record.state.value.replace("_", " ")
        if record.run_id:
            detail += f" (run {record.run_id[:8]}, {_rows(progress_of(record.run_id))})"
        else:
            detail = "never ran"
        lines.append(f"- {record.key}: {detail}")
    if len(report.stale) > LISTED:
        lines.append(f"- ... and {len(report.stale) - LISTED} more")
    if report.trino:
        lines.append(f"Trino cannot read the tables: {_clip(report.trino)}")
    look = f"look: {dagster_url.rstrip('/')}/assets/{night_end().asset} · kimi-batch status"
    if report.failed_checks:
        lines.append(f"{len(report.failed_checks)} failed check(s):")
        lines.extend(_checks_that_fit(report.failed_checks, len("\n".join([*lines, look])) + 1))
    lines.append(look)
    return "\n".join(lines)


def _checks_that_fit(checks: Sequence[FailedCheck], used: int) -> list[str]:
    """Up to LISTED of `checks`' lines, fewer where the message would not fit MAX_TEXT_CHARS
    with them (`used` characters taken already); the rest counted in a last line."""
    listed = [_clip(f"- {item.partition}: {item.describe()}") for item in checks[:LISTED]]
    while True:
        left = len(checks) - len(listed)
        lines = listed + ([f"- ... and {left} more"] if left else [])
        if not listed or used + sum(len(line) + 1 for line in lines) <= MAX_TEXT_CHARS:
            return lines
        listed.pop()
