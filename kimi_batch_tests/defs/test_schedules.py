"""The nightly schedule evaluated at given nights on a real temporary instance."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import dagster as dg
import pytest

from kimi_batch.defs import schedules
from kimi_batch.defs.schedules import (
    BatchPartition,
    night_ds,
    nightly_distillation_schedule,
    nightly_partitions,
)
from kimi_batch_tests.support.repo import REPO_ROOT
from kimi_batch_tests.support.standins import standin_definitions

pytestmark = pytest.mark.filterwarnings("ignore:Non-compliant tag keys:DeprecationWarning")

NIGHT = datetime(2025, 6, 2, 2, 0, tzinfo=UTC)  # the night after June 1


def put(path: Path, *, mtime: datetime | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"prompt": "hi"}\n')
    if mtime is not None:
        os.utime(path, (mtime.timestamp(), mtime.timestamp()))
    return path


@pytest.fixture
def inbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path))
    path = tmp_path / "inbox"
    put(path / "2025-06-01" / "alpha.jsonl")
    put(path / "2025-06-01" / "beta.jsonl")
    put(path / "late_upload.jsonl", mtime=datetime(2025, 6, 1, 23, 59, tzinfo=UTC))
    # Not June 1: the day before, the day after, a root file from June 2.
    put(path / "2025-05-31" / "old.jsonl")
    put(path / "2025-06-02" / "next.jsonl")
    put(path / "early.jsonl", mtime=datetime(2025, 6, 2, 0, 1, tzinfo=UTC))
    return path


def evaluate(
    instance: dg.DagsterInstance, when: datetime
) -> tuple[list[dg.RunRequest], str | None]:
    context = dg.build_schedule_context(
        instance=instance,
        scheduled_execution_time=when,
        repository_def=standin_definitions().get_repository_def(),
    )
    data = nightly_distillation_schedule.evaluate_tick(context)
    return list(data.run_requests or []), data.skip_message


def mpk(source: str, ds: str = "2025-06-01") -> dg.MultiPartitionKey:
    return dg.MultiPartitionKey({"date": ds, "source": source})


def test_night_returns_exactly_that_days_partitions(inbox: Path) -> None:
    with dg.instance_for_test() as instance:
        requests, skip = evaluate(instance, NIGHT)
        sources = instance.get_dynamic_partitions("source")

    assert skip is None
    assert [request.partition_key for request in requests] == [
        mpk("alpha"),
        mpk("beta"),
        mpk("late_upload"),
    ]
    assert [request.run_key for request in requests] == [
        "nightly:2025-06-01:alpha",
        "nightly:2025-06-01:beta",
        "nightly:2025-06-01:late_upload",
    ]
    assert all(request.tags["kimi_batch/night"] == "2025-06-01" for request in requests)
    assert all(request.tags[schedules.TRIGGER_TAG] == "nightly" for request in requests)
    # The sources were added so the partitioned run requests resolve (and a backfill sees them).
    assert {"alpha", "beta", "late_upload"} <= set(sources)


def test_re_evaluating_a_night_gives_the_same_run_keys(inbox: Path) -> None:
    with dg.instance_for_test() as instance:
        first, _ = evaluate(instance, NIGHT)
        second, _ = evaluate(instance, NIGHT)

    assert [r.run_key for r in first] == [r.run_key for r in second]


def test_night_with_nothing_is_a_skip(inbox: Path) -> None:
    with dg.instance_for_test() as instance:
        requests, skip = evaluate(instance, datetime(2025, 6, 10, 2, 0, tzinfo=UTC))

    assert requests == []
    assert skip == "nothing arrived on 2025-06-09"


def test_already_amplified_partitions_count_when_their_file_is_gone(inbox: Path) -> None:
    defs = standin_definitions()
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("source", ["cleaned_up", "elsewhere"])
        for partition in (mpk("cleaned_up"), mpk("elsewhere", "2025-05-20")):
            result = dg.materialize(
                [defs.get_assets_def("amplified_prompts")],
                partition_key=str(partition),
                instance=instance,
            )
            assert result.success
        requests, _ = evaluate(instance, NIGHT)

    assert [request.partition_key for request in requests] == [
        mpk("alpha"),
        mpk("beta"),
        mpk("cleaned_up"),
        mpk("late_upload"),
    ]


def test_nightly_partitions_pure(inbox: Path) -> None:
    assert nightly_partitions(inbox, "2025-06-02", ["2025-06-02|extra", "2025-06-01|no"]) == [
        BatchPartition(ds="2025-06-02", source="early"),
        BatchPartition(ds="2025-06-02", source="extra"),
        BatchPartition(ds="2025-06-02", source="next"),
    ]
    assert nightly_partitions(inbox, "2030-01-01") == []


@pytest.mark.parametrize(
    ("when", "zone", "ds"),
    [
        (datetime(2025, 6, 2, 2, 0, tzinfo=UTC), "UTC", "2025-06-01"),
        (datetime(2025, 6, 2, 2, 0), "Europe/Berlin", "2025-06-01"),  # naive = schedule time
        # 00:30 UTC on June 2 is still June 1 in New York: the night of May 31 just ended there.
        (datetime(2025, 6, 2, 0, 30, tzinfo=UTC), "America/New_York", "2025-05-31"),
        (datetime(2025, 1, 1, 2, 0, tzinfo=ZoneInfo("Asia/Tokyo")), "Asia/Tokyo", "2024-12-31"),
    ],
)
def test_night_ds(when: datetime, zone: str, ds: str) -> None:
    assert night_ds(when, zone) == ds


def test_job_is_the_partitioned_distillation_job() -> None:
    defs = standin_definitions()
    job = defs.resolve_job_def(nightly_distillation_schedule.job_name)

    assert nightly_distillation_schedule.job_name == "distillation_job"
    assert job.partitions_def is not None
    assert job.partitions_def == defs.get_assets_def("distilled_responses").partitions_def
    # Upstream included, so a day the sensor never ingested is still distilled.
    assert sorted(key.to_user_string() for key in job.asset_layer.executable_asset_keys) == [
        "amplified_prompts",
        "distilled_responses",
        "seed_prompts",
    ]


def _schedule_settings(env: dict[str, str]) -> dict[str, str]:
    """cron, timezone and default status of the schedule as a fresh process imports it."""
    code = (
        "import json; from kimi_batch.defs.schedules import nightly_distillation_schedule as s; "
        "print(json.dumps({'cron': s.cron_schedule, 'tz': s.execution_timezone, "
        "'status': s.default_status.value}))"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KIMI_BATCH_NIGHTLY")}
    clean.pop("KIMI_BATCH_TIMEZONE", None)
    output = subprocess.run(
        [sys.executable, "-c", code],
        env={**clean, **env},
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    return json.loads(output.strip().splitlines()[-1])


@pytest.mark.slow
def test_cron_timezone_and_status_come_from_the_environment() -> None:
    assert _schedule_settings({}) == {"cron": "0 2 * * *", "tz": "UTC", "status": "STOPPED"}
    assert _schedule_settings(
        {
            "KIMI_BATCH_NIGHTLY_CRON": "30 3 * * 1-5",
            "KIMI_BATCH_TIMEZONE": "Europe/Berlin",
            "KIMI_BATCH_NIGHTLY_STATUS": "running",
        }
    ) == {"cron": "30 3 * * 1-5", "tz": "Europe/Berlin", "status": "RUNNING"}


@pytest.mark.slow
def test_bad_timezone_fails_loudly() -> None:
    with pytest.raises(subprocess.CalledProcessError) as caught:
        _schedule_settings({"KIMI_BATCH_TIMEZONE": "Mars/Olympus"})
    assert "KIMI_BATCH_TIMEZONE" in caught.value.stderr
