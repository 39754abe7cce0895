"""A user's cancel of a Batch API batch ends its run CANCELED, and the failure alert stays quiet.

The real `api_batch_responses` runs in process on a real temporary Dagster instance, for a batch
the user cancelled before its run took it up (no llama-server is asked anything then); the real
`run_failure_alert` sensor is evaluated the way the daemon evaluates it, posting to a real HTTP
receiver on loopback. A run that fails beside it is alerted, so the receiver is listening. The
cancel in the middle of a batch is the same ending, on the real stack: `api/test_full_stack.py`.
"""

import json
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from kimi_batch.batch_api import ApiStore, BatchRecord, BatchStatus
from kimi_batch.definitions import build_resources
from kimi_batch.defs.alerts import build_alerts
from kimi_batch.defs.assets.api_batch import API_TRIGGER_TAG, api_batch_responses
from kimi_batch.defs.partitions import API_BATCH_PARTITIONS_NAME
from kimi_batch.settings import Settings
from kimi_batch_tests.support.batches import chat_line, jsonl, landed_batch
from kimi_batch_tests.support.webhook import Receiver

pytestmark = pytest.mark.filterwarnings("ignore:Non-compliant tag keys:DeprecationWarning")


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Receiver]:
    with Receiver() as found:
        monkeypatch.setenv("KIMI_BATCH_ALERT_WEBHOOK", found.url)
        monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path / "home"))
        yield found


def _cancelled_batch(settings: Settings, custom_ids: tuple[str, ...]) -> BatchRecord:
    """A landed batch the user cancelled before its run started."""
    batch = landed_batch(settings, jsonl(*(chat_line(custom_id) for custom_id in custom_ids)))
    with ApiStore(settings.paths) as store:
        return store.update_batch(batch.id, status=BatchStatus.CANCELLING)


@dg.asset
def exploding() -> None:
    raise RuntimeError("a real failure")


def _alert_tick(
    sensor: dg.SensorDefinition, instance: dg.DagsterInstance, cursor: str | None
) -> str | None:
    """One daemon-style evaluation of the run-status sensor; its new cursor."""
    return sensor.evaluate_tick(dg.build_sensor_context(instance=instance, cursor=cursor)).cursor


def test_a_cancelled_batch_ends_its_run_canceled_and_alerts_nobody(receiver: Receiver) -> None:
    settings = Settings.from_env()
    [sensor] = [s for s in build_alerts(settings).sensors or [] if s.name == "run_failure_alert"]
    batch = _cancelled_batch(settings, ("a", "b"))
    with dg.instance_for_test() as instance:
        cursor = _alert_tick(sensor, instance, None)  # the first tick only starts the cursor
        instance.add_dynamic_partitions(API_BATCH_PARTITIONS_NAME, [batch.id])
        cancelled = dg.materialize(
            [api_batch_responses],
            partition_key=batch.id,
            resources=build_resources(settings),
            instance=instance,
            tags={API_TRIGGER_TAG: batch.id},  # as the API batch sensor starts it
            raise_on_error=False,
        )
        failed = dg.materialize([exploding], instance=instance, raise_on_error=False)
        _alert_tick(sensor, instance, cursor)
        run = instance.get_run_by_id(cancelled.run_id)
        assert run is not None
        assert run.status == dg.DagsterRunStatus.CANCELED
        assert not cancelled.get_asset_materialization_events()

    assert len(receiver.texts) == 1, receiver.texts  # the failed run's, not the cancelled one's
    assert f"run {failed.run_id[:8]}" in receiver.texts[0]
    assert cancelled.run_id[:8] not in receiver.texts[0]
    with ApiStore(settings.paths) as store:
        done = store.batch(batch.id)
        assert done is not None
        assert done.status == BatchStatus.CANCELLED
        assert done.cancelled_at is not None
        assert done.error_file_id is not None
        errors = store.file(done.error_file_id)
        assert errors is not None
        unanswered = [json.loads(line) for line in store.blob_path(errors).read_text().splitlines()]
    assert [line["custom_id"] for line in unanswered] == ["a", "b"]
    assert {line["error"]["code"] for line in unanswered} == {"batch_cancelled"}
