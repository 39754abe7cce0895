"""Morning alerts: nobody watches the night, so a failed run and an overdue night are posted.

- `run_failure_alert`: one message per failed run (what failed, which partition, or for the
  night's one `nightly_job` run the partitions it covered, rows done/total from the run's last
  progress line, where to look).
- Freshness is Dagster's own: `build_last_update_freshness_checks` puts a `freshness_check` on
  `distilled_responses` (updated within the day before each end of the nightly window,
  `KIMI_BATCH_NIGHT_ENDS`, 07:00 when unset, in the schedule's timezone), and
  `build_sensor_for_freshness_checks` evaluates it once each deadline has passed. A night with
  nothing to distill is not a missed one: the schedule records an observation then
  (`schedules.report_idle_night`).
- `morning_report` posts from that check's results, once per night: the first evaluation after a
  night's deadline that failed, or that passed while partitions of that night are not distilled
  or have a failed `truncation_rate` or `benchmark_contamination` check (those do not fail their
  run, so nothing else would tell the morning), or while the configured Trino cannot count the
  night's `distilled` rows (the tables are fine, their readers are not). A message the webhook
  does not take is sent again on the next tick.

Messages go to `KIMI_BATCH_ALERT_WEBHOOK` (Slack-compatible JSON). The sensors start running when
that variable is set and stopped otherwise; without a webhook they only record and log.
"""

import logging
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, time, timedelta

import dagster as dg
from pydantic import BaseModel, ConfigDict

from kimi_batch.defs.check_states import FailedCheck, failed_checks
from kimi_batch.defs.deployment import deployment_settings
from kimi_batch.defs.partition_states import (
    PARTITION_TAG,
    PartitionRecord,
    PartitionState,
    distill_states,
    night_end_key,
    night_partitions,
    run_progress,
)
from kimi_batch.defs.partitions import DATE_DIMENSION, SOURCE_DIMENSION
from kimi_batch.defs.webhook import post_message
from kimi_batch.settings import Settings
from kimi_batch.storage import Landing, StorageError
from kimi_batch.warehouse import TrinoConfig, TrinoReader

DEFAULT_NIGHT_ENDS = time(7, 0)
# The name Dagster's freshness-check factory gives its check.
FRESHNESS_CHECK = "freshness_check"
FRESHNESS_SENSOR = "distilled_freshness_checks"
# Partition keys a message lists (a nightly run's, an overdue night's); the counts stay exact.
_LISTED = 10
FRESHNESS_INTERVAL_S = 300
# The morning's one Trino query: a count, which a working Trino answers in seconds.
TRINO_PROBE_TIMEOUT_S = 60.0
# The night's update must fall within the day before its deadline: the night before's does not do.
_NIGHT_SPAN = timedelta(hours=24)


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


# ---- the night, from the freshness check's results ----------------------------------------------


@contextmanager
def _superseded_ok() -> Iterator[None]:
    """Quiet the factories' SupersessionWarning: what supersedes them, `FreshnessPolicy`, is a
    preview whose alerts are a hosted (Dagster+) feature; these are the open-source ones."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.SupersessionWarning)
        yield


def build_freshness_checks(settings: Settings) -> Sequence[dg.AssetChecksDefinition]:
    """Dagster's freshness check of the night's end (`distilled_responses`, or the last
    always-on stage declared after it): updated by each night's end."""
    ends = settings.night_ends or DEFAULT_NIGHT_ENDS
    with _superseded_ok():
        return dg.build_last_update_freshness_checks(
            assets=[night_end_key()],
            lower_bound_delta=_NIGHT_SPAN,
            deadline_cron=f"{ends.minute} {ends.hour} * * *",
            timezone=settings.timezone,
            severity=dg.AssetCheckSeverity.WARN,
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
    the one of D-1.
    """
    ends = night_ends or DEFAULT_NIGHT_ENDS
    deadline = datetime.combine(now.date(), ends, tzinfo=now.tzinfo)
    if now < deadline:
        deadline -= timedelta(days=1)
    return (deadline.date() - timedelta(days=1)).isoformat(), deadline


def night_report(
    instance: dg.DagsterInstance, settings: Settings, evaluation: dg.AssetCheckEvaluation, at: float
) -> NightReport:
    """The night due when the freshness check gave `evaluation` (at timestamp `at`).

    The night's partitions are the inputs assigned to its day in the landing manifest (where the
    sensor, the schedule and the demo record every input's partition when they first see it).
    """
    evaluated = datetime.fromtimestamp(at, UTC).astimezone(settings.zone)
    ds, deadline = due_night(evaluated, settings.night_ends)
    with Landing(settings.paths) as landing:
        assigned = [item for item in landing.assignments() if item.ds == ds]
    keys = [
        str(dg.MultiPartitionKey({DATE_DIMENSION: item.ds, SOURCE_DIMENSION: item.source}))
        for item in assigned
    ]
    states = distill_states(instance, keys)
    return NightReport(
        ds=ds,
        deadline=deadline,
        fresh=evaluation.passed,
        freshness=evaluation.description or "",
        expected=keys,
        stale=[states[key] for key in keys if states[key].state != PartitionState.DONE],
        failed_checks=failed_checks(instance, keys),
        trino=trino_problem(settings, ds),
    )


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
            f"kimi_batch: {night_end_key().to_user_string()} is OVERDUE at "
            f"{report.deadline:%Y-%m-%d %H:%M %Z} "
            f"(night {report.ds}): {report.freshness}"
        )
    if report.stale:
        return f"kimi_batch: night {report.ds} not distilled by {report.deadline:%Y-%m-%d %H:%M %Z}"
    if not report.failed_checks:
        return f"kimi_batch: night {report.ds} distilled, but Trino cannot read the tables"
    return f"kimi_batch: night {report.ds} distilled, but checks failed"


def night_message(instance: dg.DagsterInstance, report: NightReport, dagster_url: str) -> str:
    """The morning message of a night that was overdue, left partitions or failed checks."""
    lines = [_headline(report)]
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
    if report.trino:
        lines.append(f"Trino cannot read the tables: {report.trino}")
    if report.failed_checks:
        lines.append(f"{len(report.failed_checks)} failed check(s):")
        lines.extend(
            f"- {item.partition}: {item.describe()}" for item in report.failed_checks[:_LISTED]
        )
    lines.append(
        f"look: {dagster_url.rstrip('/')}/assets/{night_end_key().to_user_string()} "
        "· kimi-batch status"
    )
    return "\n".join(lines)


def _latest_evaluation(
    instance: dg.DagsterInstance, key: dg.AssetCheckKey
) -> tuple[dg.AssetCheckEvaluation, float] | None:
    """The freshness check's newest completed evaluation and when it was made."""
    summary = instance.event_log_storage.get_asset_check_summary_records([key])[key]
    record = summary.last_completed_check_execution_record
    if record is None or record.evaluation is None:
        return None
    at = record.event.timestamp if record.event is not None else record.create_timestamp
    return record.evaluation, at


def _morning_report(settings: Settings, key: dg.AssetCheckKey) -> dg.SensorDefinition:
    @dg.sensor(
        name="morning_report",
        minimum_interval_seconds=FRESHNESS_INTERVAL_S,
        default_status=_default_status(settings),
        description=f"Posts to KIMI_BATCH_ALERT_WEBHOOK once per night, from the first result of "
        f"{key.to_user_string()} after the night's end: overdue, partitions not distilled, "
        "failed checks (cut-off answers, contamination), Trino unable to read the tables.",
    )
    def morning_report(context: dg.SensorEvaluationContext) -> dg.SensorResult | dg.SkipReason:
        """Report the night the freshness check judged last, once (until the webhook takes it)."""
        latest = _latest_evaluation(context.instance, key)
        if latest is None:
            return dg.SkipReason(f"{key.to_user_string()} has not been evaluated yet")
        report = night_report(context.instance, settings, *latest)
        if context.cursor == report.ds:
            return dg.SkipReason(f"night {report.ds} already reported")
        if report.passed:
            context.log.info(f"night {report.ds}: {len(report.expected)} partition(s) distilled")
        elif not _deliver(
            context.log, settings, night_message(context.instance, report, settings.dagster_url)
        ):
            return dg.SkipReason(f"night {report.ds}: the webhook did not take it; next tick")
        return dg.SensorResult(cursor=report.ds)

    return morning_report


def build_alerts(settings: Settings) -> dg.Definitions:
    """The failure alert, Dagster's freshness check and its sensor, and the morning report."""

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

    checks = build_freshness_checks(settings)
    (key,) = [key for check in checks for key in check.check_keys]
    with _superseded_ok():
        freshness_sensor = dg.build_sensor_for_freshness_checks(
            freshness_checks=checks,
            name=FRESHNESS_SENSOR,
            minimum_interval_seconds=FRESHNESS_INTERVAL_S,
            default_status=_default_status(settings),
        )
    return dg.Definitions(
        asset_checks=checks,
        sensors=[run_failure_alert, freshness_sensor, _morning_report(settings, key)],
    )


@dg.definitions
def defs() -> dg.Definitions:
    """The morning alerts of this code location."""
    return build_alerts(deployment_settings())
