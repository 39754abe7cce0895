"""The tables' maintenance job and its daily schedule."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from pathlib import Path

import dagster as dg
import pytest

from kimi_batch.defs.jobs import NIGHTLY_JOB_NAME
from kimi_batch.defs.maintenance import build_maintenance_schedule, maintenance_job
from kimi_batch.defs.resources import WarehouseResource
from kimi_batch.settings import Settings
from kimi_batch.warehouse import open_warehouse
from kimi_batch_tests.support.rows import amplified

NOON = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path))
    monkeypatch.setenv("KIMI_BATCH_SNAPSHOT_RETENTION_DAYS", "3")
    return Settings.from_env()


def _tick(settings: Settings, instance: dg.DagsterInstance) -> dg.RunRequest | dg.SkipReason:
    schedule = build_maintenance_schedule(settings)
    with dg.build_schedule_context(instance=instance, scheduled_execution_time=NOON) as context:
        data = schedule.evaluate_tick(context)
    if data.skip_message is not None:
        return dg.SkipReason(data.skip_message)
    (request,) = data.run_requests or []
    return request


def test_the_daily_tick_asks_for_one_run_a_day_and_waits_for_a_running_night(
    settings: Settings,
) -> None:
    schedule = build_maintenance_schedule(settings)
    assert schedule.cron_schedule == "0 12 * * *"
    assert schedule.default_status == dg.DefaultScheduleStatus.STOPPED
    with dg.instance_for_test() as instance:
        request = _tick(settings, instance)
        assert isinstance(request, dg.RunRequest)
        assert request.run_key == "maintenance:2025-06-01"
        night = dg.DagsterRun(
            job_name=NIGHTLY_JOB_NAME,
            run_id=str(uuid.uuid4()),
            status=dg.DagsterRunStatus.STARTED,
        )
        instance.add_run(night)
        skipped = _tick(settings, instance)
    assert isinstance(skipped, dg.SkipReason)
    assert "night is still running" in (skipped.skip_message or "")


def test_the_job_maintains_every_written_table(settings: Settings) -> None:
    warehouse = open_warehouse(settings)
    for n in range(3):
        warehouse.write_partition("amplified", "2025-06-01", "demo", amplified(n + 1))

    result = maintenance_job.execute_in_process(
        resources={"warehouse": WarehouseResource(deployment=settings)}
    )

    assert result.success
    (materialized,) = [
        event for event in result.all_events if event.event_type == dg.DagsterEventType.STEP_OUTPUT
    ]
    assert materialized.step_key == "maintain_tables"
    # Within the retention (3 days): nothing expired, the table reads as written.
    assert warehouse.count("amplified") == 3
    iceberg = warehouse.iceberg_table("amplified")
    assert iceberg is not None
    assert len(iceberg.metadata.snapshots) >= 3
