"""The night's record of a landed partition (no server): its materialization with its checks and
nothing pending (a commit is visible to Trino at once)."""

# No `from __future__ import annotations`: Dagster reads the op function's annotations.

import dagster as dg

from kimi_batch.defs.assets.stage_asset import record

KEY = "2024-05-01|north"
SEEDS = dg.AssetKey("seed_prompts")
LANDED = dg.MaterializeResult(
    metadata={"rows": 2},
    check_results=[dg.AssetCheckResult(check_name="truncation_rate", passed=True)],
)


def _night() -> dg.JobDefinition:
    """A one-op job that records one landed seeds partition, as the night op does."""

    @dg.op
    def lands(context: dg.OpExecutionContext) -> None:
        record(context, SEEDS, KEY, LANDED)

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


def test_the_night_records_a_landed_partition_with_its_checks_and_nothing_pending() -> None:
    with dg.instance_for_test() as instance:
        result = _night().execute_in_process(instance=instance)
        events = _events(instance, result.run_id)
    assert result.success
    assert events == [("materialized", KEY, 2), ("checked", KEY, "truncation_rate")]
