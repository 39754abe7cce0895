"""Morning alerts: nobody watches the night, so a failed run and an unfinished night are posted.

- `run_failure_alert`: one message per failed run (what failed, which partition, or for the
  night's one `nightly_job` run the partitions it covered, rows done/total from the run's last
  progress line, where to look).
- `distilled_by_night_end`: the freshness check of `distilled_responses`: every partition of the
  day that just ended is distilled by the end of the nightly window (`KIMI_BATCH_NIGHT_ENDS`,
  07:00 when unset, in the schedule's timezone). `distilled_freshness_alert` evaluates it once
  per night after that deadline, records the result on the check (the UI shows it) and posts a
  message when it fails. The check can also be executed from the UI at any time. A partition
  whose latest `published_to_trino`, `truncation_rate` or `benchmark_contamination` check failed
  fails it too, by name: those checks do not fail their run, so nothing else would tell the
  morning. When the webhook does not take the message, the night's cursor is not advanced and
  the next tick delivers it again.

Messages go to `KIMI_BATCH_ALERT_WEBHOOK` (Slack-compatible JSON). Both sensors start running when
that variable is set and stopped otherwise; without a webhook they only record and log.

No `from __future__ import annotations`: Dagster inspects the check's `context` annotation.
"""

import logging
from datetime import UTC, datetime, time, timedelta

import dagster as dg
from pydantic import BaseModel, ConfigDict

from kimi_batch.defs.check_states import FailedCheck, failed_checks
from kimi_batch.defs.deployment import deployment_settings
from kimi_batch.defs.jobs import DISTILLED_RESPONSES
from kimi_batch.defs.partition_states import (
    PARTITION_TAG,
    PartitionRecord,
    PartitionState,
    distill_states,
    night_partitions,
    run_progress,
)
from kimi_batch.defs.partitions import DATE_DIMENSION, SOURCE_DIMENSION
from kimi_batch.defs.webhook import post_message
from kimi_batch.settings import Settings
from kimi_batch.storage import Landing

__all__ = [
    "DEFAULT_NIGHT_ENDS",
    "FRESHNESS_CHECK",
    "FreshnessReport",
    "build_alerts",
    "defs",
    "due_night",
    "evaluate_freshness",
    "failure_message",
    "stale_message",
]

DEFAULT_NIGHT_ENDS = time(7, 0)
FRESHNESS_CHECK = "distilled_by_night_end"
# Partition keys a message lists (a nightly run's, a stale night's); the counts stay exact.
_LISTED = 10
FRESHNESS_INTERVAL_S = 300


def _default_status(settings: Settings) -> dg.DefaultSensorStatus:
    # Read when the location loads, like the other sensors' statuses: set it, reload the location.
    return (
        dg.DefaultSensorStatus.RUNNING if settings.alert_webhook else dg.DefaultSensorStatus.STOPPED
    )


def _deliver(context_log: logging.Logger, settings: Settings, text: str) -> bool:
    """False only when the webhook did not take the message (without a webhook: logged, True)."""
    if not settings.alert_webhook:
        context_log.info(f"no KIMI_BATCH_ALERT_WEBHOOK; alert not sent:\n{text}")
        return True
    result = post_message(settings.alert_webhook, text)
    if not result.delivered:
        context_log.warning(f"alert webhook failed ({result.error}); the alert was:\n{text}")
    return result.delivered


def _rows(event_done: int | None, event_total: int | None) -> str:
    if event_done is None or event_total is None:
        return "no rows reported"
    return f"{event_done}/{event_total} rows done"


# ---- failed runs --------------------------------------------------------------------------------


def failure_message(
    instance: dg.DagsterInstance,
    run: dg.DagsterRun,
    step_errors: list[str],
    dagster_url: str,
) -> str:
    """The alert for one failed run."""
    progress = run_progress(instance, run.run_id)
    partition = f"partition: {run.tags.get(PARTITION_TAG, 'none')}"
    covered = night_partitions(run)
    if covered:  # one nightly run covers the night; its step error names the partitions it lost
        shown = ", ".join(covered[:_LISTED])
        more = f" and {len(covered) - _LISTED} more" if len(covered) > _LISTED else ""
        partition = f"partitions: {len(covered)} ({shown}{more})"
    what = "; ".join(step_errors[:3]) or "the run failed before any step ran"
    rows = _rows(progress.done if progress else None, progress.total if progress else None)
    return "\n".join(
        [
            f"kimi_batch: run {run.run_id[:8]} of {run.job_name} FAILED",
            partition,
            f"what failed: {what}",
            f"rows: {rows} (finished rows are kept in the ledger; a rerun resumes)",
            f"look: {dagster_url.rstrip('/')}/runs/{run.run_id} · kimi-batch status",
        ]
    )


def _step_errors(context: dg.RunFailureSensorContext) -> list[str]:
    errors = []
    for event in context.get_step_failure_events():
        error = event.step_failure_data.error
        # Dagster wraps the asset's exception; the innermost cause is what the user raised.
        while error is not None and error.cause is not None:
            error = error.cause
        message = (error.message if error else event.message or "").strip()
        if error is not None and error.cls_name == "Failure":  # the description the step gave
            message = message.removeprefix(f"{dg.Failure.__module__}.Failure:").strip()
        first = message.splitlines()
        errors.append(f"{event.step_key}: {first[0] if first else 'failed'}")
    return errors


# ---- freshness of distilled_responses -----------------------------------------------------------


class FreshnessReport(BaseModel):
    """Whether the partitions of night `ds` were distilled by `deadline`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ds: str
    deadline: datetime
    expected: list[str]
    stale: list[PartitionRecord]
    failed_checks: list[FailedCheck] = []

    @property
    def passed(self) -> bool:
        return not self.stale and not self.failed_checks


def due_night(now: datetime, night_ends: time | None) -> tuple[str, datetime]:
    """(the day of the last night whose window has ended at `now`, that window's end).

    The night after day D ends on D+1 at `night_ends`; before that time on D+1, the night due is
    the one of D-1.
    """
    ends = night_ends or DEFAULT_NIGHT_ENDS
    deadline = datetime.combine(now.date(), ends, tzinfo=now.tzinfo)
    if now < deadline:
        deadline -= timedelta(days=1)
    return (deadline.date() - timedelta(days=1)).isoformat(), deadline


def evaluate_freshness(
    instance: dg.DagsterInstance, settings: Settings, now: datetime
) -> FreshnessReport:
    """Which partitions of the night that ended last are not distilled (yet).

    The night's partitions are the inputs assigned to its day in the landing manifest (where the
    sensor, the schedule and the demo record every input's partition when they first see it).
    """
    ds, deadline = due_night(now.astimezone(settings.zone), settings.night_ends)
    with Landing(settings.paths) as landing:
        assigned = [item for item in landing.assignments() if item.ds == ds]
    keys = [
        str(dg.MultiPartitionKey({DATE_DIMENSION: item.ds, SOURCE_DIMENSION: item.source}))
        for item in assigned
    ]
    states = distill_states(instance, keys)
    stale = [states[key] for key in keys if states[key].state != PartitionState.DONE]
    failed = failed_checks(instance, keys)
    return FreshnessReport(
        ds=ds, deadline=deadline, expected=keys, stale=stale, failed_checks=failed
    )


def stale_message(instance: dg.DagsterInstance, report: FreshnessReport, dagster_url: str) -> str:
    """The alert for a night that was not distilled in time."""
    lines = [
        f"kimi_batch: distilled_responses is STALE: night {report.ds} not distilled by "
        f"{report.deadline:%Y-%m-%d %H:%M %Z}"
        if report.stale
        else f"kimi_batch: night {report.ds} distilled, but checks failed",
    ]
    if report.stale:
        lines.append(f"{len(report.stale)} of {len(report.expected)} partition(s) not done:")
    for record in report.stale[:_LISTED]:
        detail = record.state.value.replace("_", " ")
        if record.run_id:
            progress = run_progress(instance, record.run_id)
            rows = _rows(progress.done if progress else None, progress.total if progress else None)
            detail += f" (run {record.run_id[:8]}, {rows})"
        else:
            detail = "never ran"
        lines.append(f"- {record.key}: {detail}")
    if len(report.stale) > _LISTED:
        lines.append(f"- ... and {len(report.stale) - _LISTED} more")
    if report.failed_checks:
        lines.append(f"{len(report.failed_checks)} failed check(s):")
        lines.extend(
            f"- {item.partition}: {item.describe()}" for item in report.failed_checks[:_LISTED]
        )
    lines.append(
        f"look: {dagster_url.rstrip('/')}/assets/{DISTILLED_RESPONSES.to_user_string()} "
        "· kimi-batch status"
    )
    return "\n".join(lines)


def _evaluation(report: FreshnessReport) -> dg.AssetCheckEvaluation:
    return dg.AssetCheckEvaluation(
        asset_key=DISTILLED_RESPONSES,
        check_name=FRESHNESS_CHECK,
        passed=report.passed,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={
            "night": report.ds,
            "deadline": report.deadline.isoformat(),
            "expected_partitions": len(report.expected),
            "stale_partitions": len(report.stale),
            "stale": ", ".join(record.key for record in report.stale[:20]) or "none",
            "failed_checks": len(report.failed_checks),
        },
    )


def build_alerts(settings: Settings) -> dg.Definitions:
    """The failure alert, the freshness check and its nightly sensor for the deployment."""

    @dg.run_failure_sensor(
        name="run_failure_alert",
        default_status=_default_status(settings),
        description="Posts one message per failed run to KIMI_BATCH_ALERT_WEBHOOK: what failed, "
        "the partition, rows done/total, and the run's page.",
    )
    def run_failure_alert(context: dg.RunFailureSensorContext) -> None:
        """Tell the morning about a failed run."""
        text = failure_message(
            context.instance, context.dagster_run, _step_errors(context), settings.dagster_url
        )
        _deliver(context.log, settings, text)

    @dg.asset_check(
        asset=DISTILLED_RESPONSES,
        name=FRESHNESS_CHECK,
        description="Every partition of the day that just ended is distilled by the end of the "
        "nightly window (KIMI_BATCH_NIGHT_ENDS, default 07:00).",
    )
    def distilled_by_night_end(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
        """The freshness check, on demand."""
        report = evaluate_freshness(context.instance, settings, datetime.now(UTC))
        evaluation = _evaluation(report)
        return dg.AssetCheckResult(
            passed=evaluation.passed, severity=evaluation.severity, metadata=evaluation.metadata
        )

    @dg.sensor(
        name="distilled_freshness_alert",
        minimum_interval_seconds=FRESHNESS_INTERVAL_S,
        default_status=_default_status(settings),
        description="Once per night, after the nightly window ends: evaluates the "
        f"{FRESHNESS_CHECK} check of distilled_responses and posts to KIMI_BATCH_ALERT_WEBHOOK "
        "when partitions of the day that just ended are not distilled.",
    )
    def distilled_freshness_alert(
        context: dg.SensorEvaluationContext,
    ) -> dg.SensorResult | dg.SkipReason:
        """Check the night that ended last, once; alert when it is stale (until it is taken)."""
        report = evaluate_freshness(context.instance, settings, datetime.now(UTC))
        if context.cursor == report.ds:
            return dg.SkipReason(f"night {report.ds} already checked")
        # The evaluation is recorded once per night; an undelivered alert is only sent again.
        retrying = context.cursor == _undelivered(report.ds)
        events = [] if retrying else [_evaluation(report)]
        if report.passed:
            context.log.info(f"night {report.ds}: {len(report.expected)} partition(s) distilled")
        elif not _deliver(
            context.log, settings, stale_message(context.instance, report, settings.dagster_url)
        ):
            return dg.SensorResult(asset_events=events, cursor=_undelivered(report.ds))
        return dg.SensorResult(asset_events=events, cursor=report.ds)

    return dg.Definitions(
        asset_checks=[distilled_by_night_end],
        sensors=[run_failure_alert, distilled_freshness_alert],
    )


@dg.definitions
def defs() -> dg.Definitions:
    """The morning alerts of this code location."""
    return build_alerts(deployment_settings())


def _undelivered(ds: str) -> str:
    """The cursor of a night whose alert the webhook did not take: the next tick sends it again."""
    return f"{ds}:undelivered"
