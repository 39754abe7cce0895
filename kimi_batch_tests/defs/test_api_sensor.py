"""The API batch sensor: a landed batch gets its partition and one run at once; nothing else does."""

from __future__ import annotations

import io
import json
from pathlib import Path

import dagster as dg
import pytest

from kimi_batch.defs.api_sensor import build_api_batch_sensor
from kimi_batch.defs.assets.api_batch import API_TRIGGER_TAG
from kimi_batch.settings import Settings
from kimi_batch.storage import ApiStore, BatchRecord, BatchStatus, validate_batch


def _batch(store: ApiStore, settings: Settings, *, land: bool) -> BatchRecord:
    line = {
        "custom_id": "a",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"messages": [{"role": "user", "content": "Hi."}]},
    }
    upload = store.add_file(
        io.BytesIO(json.dumps(line).encode() + b"\n"),
        filename="in.jsonl",
        purpose="batch",
        max_bytes=1 << 20,
    )
    batch = store.add_batch(
        input_file_id=upload.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        completion_window_s=86400,
        metadata=None,
    )
    return validate_batch(settings, store, batch) if land else batch


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path))
    return Settings.from_env()


def _tick(instance: dg.DagsterInstance) -> dg.SensorResult:
    result = build_api_batch_sensor(Settings.from_env())(dg.build_sensor_context(instance=instance))
    assert isinstance(result, dg.SensorResult)
    return result


def test_a_landed_batch_gets_its_partition_and_one_run(settings: Settings) -> None:
    with dg.instance_for_test() as instance:
        assert not _tick(instance).run_requests  # no store yet: nothing to do
        with ApiStore(settings.paths) as store:
            landed = _batch(store, settings, land=True)
            _batch(store, settings, land=False)  # still validating: not yet
            cancelled = _batch(store, settings, land=True)
            store.update_batch(cancelled.id, status=BatchStatus.CANCELLING)
            running = _batch(store, settings, land=True)
            store.update_batch(running.id, status=BatchStatus.IN_PROGRESS, run_id="r1")
        result = _tick(instance)
        requests = result.run_requests or []
        # The cancelled one runs too: its run finishes it as cancelled at once.
        assert {r.partition_key for r in requests} == {landed.id, cancelled.id}
        assert {r.run_key for r in requests} == {f"api:{landed.id}", f"api:{cancelled.id}"}
        assert all(r.tags[API_TRIGGER_TAG] for r in requests)
        [added] = result.dynamic_partitions_requests or []
        assert isinstance(added, dg.AddDynamicPartitionsRequest)
        assert set(added.partition_keys) == {landed.id, cancelled.id}
