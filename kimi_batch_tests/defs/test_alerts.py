"""Morning alerts on a real temporary Dagster instance, posted to a real HTTP receiver on loopback.

The runs are real in-process runs of stand-ins for `distilled_responses` (same key and partitions)
that log a real progress line and then fail or succeed; the sensors are the real ones, evaluated
the way the daemon evaluates them. Freshness is Dagster's own check, launched only by Dagster's
own freshness sensor (`build_sensor_for_freshness_checks`); the morning report reads its results.
"""

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import pytest

from kimi_batch.defs.alerts import (
    FRESHNESS_CHECK,
    FRESHNESS_SENSOR,
    build_alerts,
    build_freshness_checks,
)
from kimi_batch.defs.jobs import NIGHTLY_JOB_NAME, NIGHTLY_OP_NAME, nightly_run_config
from kimi_batch.defs.partitions import DATE_DIMENSION, SOURCE_DIMENSION, build_batch_partitions
from kimi_batch.defs.schedules import report_idle_night
from kimi_batch.engine.stats import ProgressEvent
from kimi_batch.inputs.landing import Landing
from kimi_batch.settings import Settings
from kimi_batch_tests.support.night_standin import LOST_REASON, failing_night_job
from kimi_batch_tests.support.ports import free_port
from kimi_batch_tests.support.webhook import Receiver

pytestmark = pytest.mark.filterwarnings("ignore:Non-compliant tag keys:DeprecationWarning")


def _alerts() -> dg.Definitions:
    """The real alerts, built for the environment as the test has set it."""
    return build_alerts(Settings.from_env())


def _sensor(name: str) -> dg.SensorDefinition:
    return next(sensor for sensor in _alerts().sensors or [] if sensor.name == name)


def run_failure_alert(context: dg.RunFailureSensorContext) -> object:
    return _sensor("run_failure_alert")(context)


def morning_report(context: dg.SensorEvaluationContext) -> object:
    return _sensor("morning_report")(context)


def freshness_check_run(instance: dg.DagsterInstance) -> dg.AssetCheckEvaluation | None:
    """One tick of Dagster's freshness sensor and, when it asks for one, the run it asks for
    (what the daemon would launch): the evaluation that run recorded."""
    request = _sensor(FRESHNESS_SENSOR)(dg.build_sensor_context(instance=instance))
    if not isinstance(request, dg.RunRequest):
        return None
    checks = build_freshness_checks(Settings.from_env())
    result = dg.materialize(
        [_standin(fail=False), *checks],
        instance=instance,
        selection=dg.AssetSelection.checks(*(request.asset_check_keys or [])),
    )
    (evaluation,) = result.get_asset_check_evaluations()
    return evaluation


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Receiver]:
    with Receiver() as found:
        monkeypatch.setenv("KIMI_BATCH_ALERT_WEBHOOK", found.url)
        monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path / "home"))
        monkeypatch.setenv("KIMI_BATCH_DAGSTER_URL", "http://dagster.example:3000")
        yield found


def _key(ds: str, source: str) -> dg.MultiPartitionKey:
    return dg.MultiPartitionKey({DATE_DIMENSION: ds, SOURCE_DIMENSION: source})


def _standin(*, fail: bool) -> dg.AssetsDefinition:
    @dg.asset(
        name="distilled_responses", partitions_def=build_batch_partitions(Settings.from_env())
    )
    def distilled_responses(context: dg.AssetExecutionContext) -> None:
        progress = ProgressEvent(
            done=3, total=8, failed=0, completion_tokens_per_s=4.2, elapsed_s=9.0, eta_s=15.0
        )
        context.log.info(str(progress))
        if fail:
            raise RuntimeError("llama-server went away")

    return distilled_responses


def _inbox_files(ds: str, *sources: str) -> None:
    """Dated inbox files, assigned to their partitions as the sensor would on first sight."""
    settings = Settings.from_env()
    folder = settings.paths.inbox_dir / ds
    folder.mkdir(parents=True, exist_ok=True)
    for source in sources:
        (folder / f"{source}.jsonl").write_text('{"prompt": "hi"}\n')
    with Landing(settings.paths) as landing:
        landing.assign_inbox(
            settings.paths.inbox_dir,
            arrived=settings.today(),
            start=settings.first_partition_date(),
        )


def test_a_failed_run_posts_one_message(receiver: Receiver) -> None:
    key = _key("2025-06-01", "nightly_a")
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("source", ["nightly_a"])
        result = dg.materialize(
            [_standin(fail=True)], partition_key=key, instance=instance, raise_on_error=False
        )
        assert not result.success
        run = instance.get_run_by_id(result.run_id)
        assert run is not None
        failure = next(
            event for event in result.all_events if event.event_type_value == "PIPELINE_FAILURE"
        )
        context = dg.build_run_status_sensor_context(
            sensor_name="run_failure_alert",
            dagster_instance=instance,
            dagster_run=run,
            dagster_event=failure,
        ).for_run_failure()
        run_failure_alert(context)

    assert len(receiver.texts) == 1, receiver.texts
    text = receiver.texts[0]
    assert f"run {result.run_id[:8]}" in text
    assert "FAILED" in text
    assert "partition: 2025-06-01|nightly_a" in text
    assert "distilled_responses: RuntimeError: llama-server went away" in text
    assert "3/8 rows done" in text
    assert f"http://dagster.example:3000/runs/{result.run_id}" in text


def test_a_failed_nightly_run_names_its_partitions_and_the_stale_night_the_lost_ones(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KIMI_BATCH_NIGHT_ENDS", "00:00")
    yesterday = (datetime.now(UTC).date() - timedelta(days=1)).isoformat()
    sources = ["night_a", "night_b", "night_c"]
    _inbox_files(yesterday, *sources)
    keys = [str(_key(yesterday, source)) for source in sources]
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("source", sources)
        progress = ProgressEvent(
            done=5, total=9, failed=0, completion_tokens_per_s=4.2, elapsed_s=9.0, eta_s=15.0
        )
        result = failing_night_job(keys[:1], progress=progress).execute_in_process(
            instance=instance, run_config=nightly_run_config(keys), raise_on_error=False
        )
        assert not result.success
        run = instance.get_run_by_id(result.run_id)
        assert run is not None
        failure = next(
            event for event in result.all_events if event.event_type_value == "PIPELINE_FAILURE"
        )
        run_failure_alert(
            dg.build_run_status_sensor_context(
                sensor_name="run_failure_alert",
                dagster_instance=instance,
                dagster_run=run,
                dagster_event=failure,
            ).for_run_failure()
        )
        freshness = freshness_check_run(instance)
        stale = morning_report(dg.build_sensor_context(instance=instance))

    assert freshness is not None
    assert freshness.passed
    assert isinstance(stale, dg.SensorResult)
    assert len(receiver.texts) == 2, receiver.texts
    failed, night = receiver.texts
    assert f"run {result.run_id[:8]} of {NIGHTLY_JOB_NAME} FAILED" in failed
    assert f"partitions: 3 ({', '.join(keys)})" in failed
    assert f"{NIGHTLY_OP_NAME}: 1 of 3 partitions done; {keys[1]}: {LOST_REASON}" in failed
    assert "5/9 rows done" in failed
    # The night's one run is each lost partition's attempt; the landed one is done.
    assert "2 of 3 partition(s) not done" in night
    assert f"{keys[1]}: failed (run {result.run_id[:8]}" in night
    assert f"{keys[2]}: failed (run {result.run_id[:8]}" in night
    assert keys[0] not in night


def test_a_missed_night_fails_the_freshness_check_and_posts_one_message(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The window ends at midnight, so the night due now is always yesterday's.
    monkeypatch.setenv("KIMI_BATCH_NIGHT_ENDS", "00:00")
    yesterday = (datetime.now(UTC).date() - timedelta(days=1)).isoformat()
    _inbox_files(yesterday, "missed_src")
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("source", ["missed_src"])
        # The last update was two days ago: last night nothing distilled anything.
        two_days_ago = datetime.now(UTC) - timedelta(days=2)
        instance.report_runless_asset_event(
            dg.AssetObservation(
                asset_key="distilled_responses",
                metadata={
                    "dagster/last_updated_timestamp": dg.MetadataValue.timestamp(two_days_ago)
                },
            )
        )
        evaluation = freshness_check_run(instance)
        first = morning_report(dg.build_sensor_context(instance=instance))
        assert isinstance(first, dg.SensorResult)
        again = morning_report(dg.build_sensor_context(instance=instance, cursor=first.cursor))
        # Dagster's sensor does not evaluate a failed check again before the asset changes.
        assert freshness_check_run(instance) is None

    assert evaluation is not None
    assert evaluation.check_name == FRESHNESS_CHECK
    assert not evaluation.passed
    assert "dagster/freshness_params" in evaluation.metadata  # Dagster's check, not ours
    assert isinstance(again, dg.SkipReason)
    assert first.cursor == yesterday
    (text,) = receiver.texts
    assert f"distilled_responses is OVERDUE at {datetime.now(UTC).date()} 00:00" in text
    assert f"(night {yesterday}): Asset is overdue" in text
    assert "1 of 1 partition(s) not done" in text
    assert f"{yesterday}|missed_src: never ran" in text
    assert "http://dagster.example:3000/assets/distilled_responses" in text


def test_a_night_that_left_partitions_names_them_though_the_asset_is_fresh(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KIMI_BATCH_NIGHT_ENDS", "00:00")
    yesterday = (datetime.now(UTC).date() - timedelta(days=1)).isoformat()
    _inbox_files(yesterday, "done_src", "failed_src", "missing_src")
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("source", ["done_src", "failed_src", "missing_src"])
        for source, fail in (("done_src", False), ("failed_src", True)):
            dg.materialize(
                [_standin(fail=fail)],
                partition_key=_key(yesterday, source),
                instance=instance,
                raise_on_error=False,
            )
        evaluation = freshness_check_run(instance)
        result = morning_report(dg.build_sensor_context(instance=instance))

    assert evaluation is not None
    assert evaluation.passed
    assert isinstance(result, dg.SensorResult)
    (text,) = receiver.texts
    assert f"night {yesterday} not distilled by" in text
    assert "2 of 3 partition(s) not done" in text
    assert f"{yesterday}|failed_src: failed (run " in text
    assert "3/8 rows done" in text
    assert f"{yesterday}|missing_src: never ran" in text
    assert "done_src" not in text


def test_a_night_with_nothing_to_distill_is_fresh_and_quiet(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KIMI_BATCH_NIGHT_ENDS", "00:00")
    with dg.instance_for_test() as instance:
        # What the nightly schedule records when it finds every partition distilled.
        report_idle_night(instance, (datetime.now(UTC).date() - timedelta(days=1)).isoformat())
        evaluation = freshness_check_run(instance)
        result = morning_report(dg.build_sensor_context(instance=instance))

    assert evaluation is not None
    assert evaluation.passed, evaluation.description
    assert isinstance(result, dg.SensorResult)
    assert receiver.texts == []


def test_the_morning_report_waits_for_the_freshness_check(receiver: Receiver) -> None:
    with dg.instance_for_test() as instance:
        result = morning_report(dg.build_sensor_context(instance=instance))
    assert isinstance(result, dg.SkipReason)
    assert receiver.texts == []


def test_a_distilled_night_passes_without_a_message(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("KIMI_BATCH_NIGHT_ENDS", "00:00")
    yesterday = (datetime.now(UTC).date() - timedelta(days=1)).isoformat()
    _inbox_files(yesterday, "only_src")
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("source", ["only_src"])
        dg.materialize(
            [_standin(fail=False)], partition_key=_key(yesterday, "only_src"), instance=instance
        )
        evaluation = freshness_check_run(instance)
        result = morning_report(dg.build_sensor_context(instance=instance))

    assert isinstance(result, dg.SensorResult)
    assert result.cursor == yesterday
    assert evaluation is not None
    assert evaluation.passed
    assert receiver.texts == []


def test_a_distilled_night_whose_trino_is_down_is_reported(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing in the run talks to Trino (a commit is visible to it at once): the morning asks it
    for the night's rows, and an outage of the tables' readers is the message."""
    port = free_port()  # nothing listens there
    monkeypatch.setenv("KIMI_BATCH_NIGHT_ENDS", "00:00")
    monkeypatch.setenv("KIMI_BATCH_TRINO_HOST", "127.0.0.1")
    monkeypatch.setenv("KIMI_BATCH_TRINO_PORT", str(port))
    yesterday = (datetime.now(UTC).date() - timedelta(days=1)).isoformat()
    _inbox_files(yesterday, "read_src")
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("source", ["read_src"])
        dg.materialize(
            [_standin(fail=False)], partition_key=_key(yesterday, "read_src"), instance=instance
        )
        freshness_check_run(instance)
        result = morning_report(dg.build_sensor_context(instance=instance))

    assert isinstance(result, dg.SensorResult)
    (text,) = receiver.texts
    assert f"kimi_batch: night {yesterday} distilled, but Trino cannot read the tables" in text
    assert f"Trino cannot read the tables: Trino at 127.0.0.1:{port} is unreachable" in text


def test_the_check_run_with_the_materialization_counts_that_partition_done(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The Materialize button runs the asset's checks in the same run, while it is still going.
    monkeypatch.setenv("KIMI_BATCH_NIGHT_ENDS", "00:00")
    yesterday = (datetime.now(UTC).date() - timedelta(days=1)).isoformat()
    _inbox_files(yesterday, "same_run")
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("source", ["same_run"])
        result = dg.materialize(
            [_standin(fail=False), *(_alerts().asset_checks or [])],
            partition_key=_key(yesterday, "same_run"),
            instance=instance,
        )
    (evaluation,) = result.get_asset_check_evaluations()
    assert evaluation.check_name == FRESHNESS_CHECK
    assert evaluation.passed, evaluation.metadata


def test_an_alert_the_webhook_refused_is_sent_again_on_the_next_tick(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KIMI_BATCH_NIGHT_ENDS", "00:00")
    yesterday = (datetime.now(UTC).date() - timedelta(days=1)).isoformat()
    _inbox_files(yesterday, "missing_src")
    with Receiver(status=500) as broken, Receiver() as working, dg.instance_for_test() as instance:
        monkeypatch.setenv("KIMI_BATCH_ALERT_WEBHOOK", broken.url)
        evaluation = freshness_check_run(instance)  # never materialized: overdue
        first = morning_report(dg.build_sensor_context(instance=instance))
        monkeypatch.setenv("KIMI_BATCH_ALERT_WEBHOOK", working.url)
        assert isinstance(first, dg.SkipReason)  # the cursor stays where it was
        second = morning_report(dg.build_sensor_context(instance=instance))
        assert isinstance(second, dg.SensorResult)
        third = morning_report(dg.build_sensor_context(instance=instance, cursor=second.cursor))

    assert evaluation is not None
    assert not evaluation.passed
    assert len(broken.texts) == 1
    assert len(working.texts) == 1, working.texts  # delivered on the next tick, once
    assert f"{yesterday}|missing_src: never ran" in working.texts[0]
    assert second.cursor == yesterday
    assert isinstance(third, dg.SkipReason)


def _checked_standin(failed_check: str, metadata: dict[str, float | str]) -> dg.AssetsDefinition:
    batch_partitions = build_batch_partitions(Settings.from_env())

    @dg.asset(
        name="distilled_responses",
        partitions_def=batch_partitions,
        check_specs=[
            dg.AssetCheckSpec(
                "benchmark_contamination",
                asset="distilled_responses",
                partitions_def=batch_partitions,
            ),
            dg.AssetCheckSpec(
                "truncation_rate", asset="distilled_responses", partitions_def=batch_partitions
            ),
        ],
    )
    def distilled_responses() -> dg.MaterializeResult:
        return dg.MaterializeResult(
            check_results=[
                dg.AssetCheckResult(
                    check_name=name,
                    passed=name != failed_check,
                    metadata=metadata if name == failed_check else {},
                )
                for name in ("benchmark_contamination", "truncation_rate")
            ]
        )

    return distilled_responses


@pytest.mark.parametrize(
    ("failed_check", "metadata", "named"),
    [
        (
            "benchmark_contamination",
            {"rate": 0.25},
            "distilled_responses benchmark_contamination (rate 0.25)",
        ),
        ("truncation_rate", {"rate": 0.476}, "distilled_responses truncation_rate (rate 0.476)"),
    ],
)
def test_the_morning_alert_names_a_distilled_partition_whose_check_failed(
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
    failed_check: str,
    metadata: dict[str, float | str],
    named: str,
) -> None:
    # The run succeeds (a failed check does not fail it), so only this alert tells the morning.
    monkeypatch.setenv("KIMI_BATCH_NIGHT_ENDS", "00:00")
    yesterday = (datetime.now(UTC).date() - timedelta(days=1)).isoformat()
    _inbox_files(yesterday, "checked_src")
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("source", ["checked_src"])
        run = dg.materialize(
            [_checked_standin(failed_check, metadata)],
            partition_key=_key(yesterday, "checked_src"),
            instance=instance,
        )
        assert run.success
        evaluation = freshness_check_run(instance)
        result = morning_report(dg.build_sensor_context(instance=instance))

    assert evaluation is not None
    assert evaluation.passed
    assert isinstance(result, dg.SensorResult)
    (text,) = receiver.texts
    assert f"kimi_batch: night {yesterday} distilled, but checks failed" in text
    assert f"- {yesterday}|checked_src: {named}" in text
