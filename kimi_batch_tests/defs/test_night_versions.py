"""The version runs a night asks for: one per partition it materialized, server-free.

A stand-in `nightly_job` (the real job and op names, the real run config) materializes some
assets of some partitions and fails naming another, as a night with a lost partition does; the
real sensor, evaluated on that run's failure, must ask one `partition_versions_job` run per
materialized partition, over exactly the assets the night materialized, with the night's stage
configs (so every request is a ledger hit) and its window, in a run config the job accepts.
"""

# No `from __future__ import annotations`: Dagster reads the op function's annotations.

from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from kimi_batch.definitions import build_definitions
from kimi_batch.defs.jobs import (
    NIGHT_RUN_TAG,
    NIGHTLY_JOB_NAME,
    NIGHTLY_OP_NAME,
    WINDOW_TAG,
    nightly_run_config,
)
from kimi_batch.defs.night_versions import PARTITION_VERSIONS_JOB
from kimi_batch.settings import Settings

DAY = "2026-03-02"
BUILT = {
    f"{DAY}|north": ["amplified_prompts", "distilled_responses", "seed_prompts"],
    f"{DAY}|south": ["seed_prompts"],  # landed, then lost before its amplification
}
LOST = f"{DAY}|west"
AMPLIFY: dict[str, Any] = {"strategies": ["paraphrase"], "max_tokens": 24}
SEEDS: dict[str, Any] = {"answer_budget_tokens": 128}
WINDOW = "2026-03-03T06:00:00+00:00"


def _night_job() -> dg.JobDefinition:
    """Materializes `BUILT` and fails naming `LOST`, under the real names."""

    @dg.op(name=NIGHTLY_OP_NAME, config_schema=dg.Permissive())
    def night_batch(context: dg.OpExecutionContext) -> None:
        for key, assets in BUILT.items():
            for asset in assets:
                context.log_event(dg.AssetMaterialization(asset, partition=key))
        raise dg.Failure(f"{LOST}: llama-server went away")

    @dg.job(name=NIGHTLY_JOB_NAME)
    def nightly_job() -> None:
        night_batch()

    return nightly_job


@pytest.fixture
def defs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dg.Definitions:
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path / "home"))
    return build_definitions(Settings.from_env())


def test_a_failed_night_asks_a_version_run_per_partition_it_materialized(
    defs: dg.Definitions,
) -> None:
    keys = [*BUILT, LOST]
    with dg.instance_for_test() as instance:
        result = _night_job().execute_in_process(
            run_config=nightly_run_config(keys, amplification=AMPLIFY, seeds=SEEDS),
            instance=instance,
            tags={WINDOW_TAG: WINDOW},
            raise_on_error=False,
        )
        assert not result.success
        sensor = defs.resolve_sensor_def("night_versions_on_failure")
        assert isinstance(sensor, dg.RunStatusSensorDefinition)
        context = dg.build_run_status_sensor_context(
            sensor_name=sensor.name,
            dagster_event=result.get_run_failure_event(),
            dagster_instance=instance,
            dagster_run=result.dagster_run,
        )
        requests = sensor(context)
    assert isinstance(requests, list)
    by_key = {request.partition_key: request for request in requests}
    assert set(by_key) == set(BUILT)  # the lost partition has nothing to version
    job = defs.resolve_job_def(PARTITION_VERSIONS_JOB)
    for key, assets in BUILT.items():
        request = by_key[key]
        assert request.job_name == PARTITION_VERSIONS_JOB
        assert request.run_key == f"{result.run_id}|{key}"
        assert request.asset_selection == [dg.AssetKey(asset) for asset in assets]
        assert request.tags[WINDOW_TAG] == WINDOW
        assert request.tags[NIGHT_RUN_TAG] == result.run_id
        subset = job.get_subset(asset_selection=set(request.asset_selection or ()))
        assert dg.validate_run_config(subset, request.run_config)
    assert by_key[f"{DAY}|north"].run_config == {
        "ops": {"seed_prompts": {"config": SEEDS}, "amplified_prompts": {"config": AMPLIFY}}
    }
    assert by_key[f"{DAY}|south"].run_config == {"ops": {"seed_prompts": {"config": SEEDS}}}


def test_a_night_that_succeeded_or_was_terminated_asks_them_too(defs: dg.Definitions) -> None:
    for name in ("night_versions_on_success", "night_versions_on_canceled"):
        sensor = defs.resolve_sensor_def(name)
        assert isinstance(sensor, dg.RunStatusSensorDefinition)
        # Stopped as the nightly schedule starts: unless KIMI_BATCH_NIGHTLY_STATUS=running.
        assert sensor.default_status == dg.DefaultSensorStatus.STOPPED


def test_they_run_where_the_nightly_schedule_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KIMI_BATCH_NIGHTLY_STATUS", "running")
    defs = build_definitions(Settings.from_env())
    sensor = defs.resolve_sensor_def("night_versions_on_failure")
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING
