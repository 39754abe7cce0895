"""Morning alerts (docs/operations/alerts.md): `run_failure_alert` (one message per failed
run), Dagster's own freshness check of the night's end and its sensor (a night with nothing to
distill records an observation: `schedules.report_idle_night`), and `morning_report`, posted
once per night from that check's results (`pipeline/alerts.py` words them). The sensors start
running when `KIMI_BATCH_ALERT_WEBHOOK` is set and stopped otherwise.
"""

import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import dagster as dg

from kimi_batch.defs.deployment import deployment_settings
from kimi_batch.defs.partition_states import (
    PARTITION_TAG,
    distill_states,
    failed_checks,
    night_end_key,
    night_partitions,
    run_progress,
)
from kimi_batch.defs.partitions import DATE_DIMENSION, SOURCE_DIMENSION
from kimi_batch.inputs import Landing
from kimi_batch.pipeline import (
    DEFAULT_NIGHT_ENDS,
    NightReport,
    PartitionState,
    deliver,
    due_night,
    failure_text,
    night_message,
    trino_problem,
)
from kimi_batch.settings import Settings

# The name Dagster's freshness-check factory gives its check.
FRESHNESS_CHECK = "freshness_check"
FRESHNESS_SENSOR = "distilled_freshness_checks"
FRESHNESS_INTERVAL_S = 300
# The night's update must fall within the day before its deadline: the night before's does not do.
_NIGHT_SPAN = timedelta(hours=24)


def _default_status(settings: Settings) -> dg.DefaultSensorStatus:
    # Read when the location loads, like the other sensors' statuses: set it, reload the location.
    return (
        dg.DefaultSensorStatus.RUNNING if settings.alert_webhook else dg.DefaultSensorStatus.STOPPED
    )


# ---- failed runs --------------------------------------------------------------------------------


def failure_message(
    instance: dg.DagsterInstance,
    run: dg.DagsterRun,
    step_errors: list[str],
    dagster_url: str,
) -> str:
    """The alert for one failed run (`pipeline.failure_text`)."""
    return failure_text(
        run.run_id,
        run.job_name,
        run.tags.get(PARTITION_TAG, "none"),
        night_partitions(run),
        step_errors,
        run_progress(instance, run.run_id),
        dagster_url,
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
        elif not deliver(
            context.log,
            settings,
            night_message(
                report, lambda run_id: run_progress(context.instance, run_id), settings.dagster_url
            ),
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
        deliver(context.log, settings, text)

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
