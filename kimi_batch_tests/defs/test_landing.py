"""The landings (no server): the night records each partition as it lands, with its checks and
nothing pending (a commit is visible to Trino at once); an asset step's landing leaves the
record to Dagster."""

# No `from __future__ import annotations`: Dagster reads the op function's annotations.

from pathlib import Path

import dagster as dg
import pytest

from kimi_batch.defs.assets.landing import NightLanding, StepLanding
from kimi_batch.engine import Ledger
from kimi_batch.pipeline import HeldPartition

KEY = "2024-05-01|north"
SEEDS = dg.AssetKey("seed_prompts")
LANDED = dg.MaterializeResult(
    metadata={"rows": 2},
    check_results=[dg.AssetCheckResult(check_name="truncation_rate", passed=True)],
)


def _night(tmp_path: Path) -> dg.JobDefinition:
    """A one-op job that lands one seeds partition through `NightLanding`."""

    @dg.op
    def lands(context: dg.OpExecutionContext) -> None:
        with (
            Ledger(tmp_path / "ledger.sqlite3") as ledger,
            ledger.lease(KEY, context.run.run_id) as lease,
        ):
            held = HeldPartition(ledger=ledger, lease=lease)
            NightLanding(context).landed(SEEDS, KEY, ["seeds", "quarantine"], held, LANDED)

    @dg.job
    def night() -> None:
        lands()

    return night


def _events(instance: dg.DagsterInstance, run_id: str) -> list[tuple[str, str, object]]:
    """(kind, partition, what) of the run's materializations and check evaluations, as stored."""
    found: list[tuple[str, str, object]] = []
    for entry in instance.all_logs(run_id):
        event = entry.dagster_event
        if event is None:
            continue
        data = event.event_specific_data
        if event.event_type_value == "ASSET_MATERIALIZATION":
            rows = data.materialization.metadata["rows"].value  # pyright: ignore[reportAttributeAccessIssue, reportOptionalMemberAccess]
            found.append(("materialized", str(event.partition), rows))
        elif event.event_type_value == "ASSET_CHECK_EVALUATION":
            name = data.check_name  # pyright: ignore[reportAttributeAccessIssue, reportOptionalMemberAccess]
            found.append(("checked", str(getattr(data, "partition", None)), name))
    return found


def test_the_night_records_a_landed_partition_with_its_checks_and_nothing_pending(
    tmp_path: Path,
) -> None:
    with dg.instance_for_test() as instance:
        result = _night(tmp_path).execute_in_process(instance=instance)
        events = _events(instance, result.run_id)
    assert result.success
    assert events == [("materialized", KEY, 2), ("checked", KEY, "truncation_rate")]


def test_an_asset_steps_landing_returns_the_result_as_landed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Ledger(tmp_path / "ledger.sqlite3") as ledger, ledger.lease(KEY, "run") as lease:
        held = HeldPartition(ledger=ledger, lease=lease)
        assert StepLanding().landed(SEEDS, KEY, ["seeds"], held, LANDED) is LANDED
