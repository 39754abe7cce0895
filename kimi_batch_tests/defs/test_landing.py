"""The night's landing (no server): a landed partition is recorded with its publish pending,
its check passes once published, and a night that dies before leaves the check failed."""

# No `from __future__ import annotations`: Dagster reads the op function's annotations.

from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from kimi_batch.defs.assets import landing as landing_module
from kimi_batch.defs.assets.landing import PublishBehind
from kimi_batch.defs.assets.lease import HeldPartition
from kimi_batch.defs.check_states import failed_checks, published_checks
from kimi_batch.defs.resources.trino import TrinoResource
from kimi_batch.engine import Ledger
from kimi_batch.settings import Settings
from kimi_batch.warehouse import Warehouse

KEY = "2024-05-01|north"
SEEDS = dg.AssetKey("seed_prompts")


def _night(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dg.JobDefinition:
    """A one-op job that lands one seeds partition through `PublishBehind`, Trino configured."""
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KIMI_BATCH_TRINO_HOST", "127.0.0.1")
    settings = Settings.from_env()
    trino = TrinoResource(deployment=settings)
    store = Warehouse(tmp_path / "warehouse")

    @dg.op
    def lands(context: dg.OpExecutionContext) -> None:
        with (
            Ledger(tmp_path / "ledger.sqlite3") as ledger,
            ledger.lease(KEY, context.run.run_id) as lease,
            PublishBehind(context, trino, store) as landing,
        ):
            held = HeldPartition(ledger=ledger, lease=lease)
            landed = dg.MaterializeResult(metadata={"rows": 2})
            landing.landed(SEEDS, KEY, ["seeds", "quarantine"], held, landed)

    @dg.job
    def night() -> None:
        lands()

    return night


def _published(*args: Any) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(check_name="published_to_trino", passed=True)


def _died(*args: Any) -> dg.AssetCheckResult:
    raise RuntimeError("the night's process died before the publish")


def _events(instance: dg.DagsterInstance, run_id: str) -> list[tuple[str, bool | None]]:
    """(kind, passed) of the run's materializations and publish checks, in order, as stored."""
    found: list[tuple[str, bool | None]] = []
    for entry in instance.all_logs(run_id):
        event = entry.dagster_event
        if event is None:
            continue
        if event.event_type_value == "ASSET_MATERIALIZATION":
            found.append(("materialized", None))
        elif event.event_type_value == "ASSET_CHECK_EVALUATION":
            found.append(("published", getattr(event.event_specific_data, "passed", None)))
    return found


def test_a_landed_partition_is_recorded_pending_then_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(landing_module, "publish_tables", _published)
    with dg.instance_for_test() as instance:
        result = _night(tmp_path, monkeypatch).execute_in_process(instance=instance)
        events = _events(instance, result.run_id)
        left = failed_checks(instance, keys=published_checks())

    assert result.success
    assert events == [("materialized", None), ("published", False), ("published", True)]
    assert left == []


def test_a_night_that_dies_before_the_publish_leaves_its_check_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(landing_module, "publish_tables", _died)
    with dg.instance_for_test() as instance:
        result = _night(tmp_path, monkeypatch).execute_in_process(
            instance=instance, raise_on_error=False
        )
        events = _events(instance, result.run_id)
        left = failed_checks(instance, keys=published_checks())

    assert not result.success
    assert events == [("materialized", None), ("published", False)]
    # What the Trino catch-up sensor reads: this partition's seeds are not published.
    assert [(item.asset, item.partition) for item in left] == [("seed_prompts", KEY)]
