"""Two partition runs queued together through a webserver + daemon, and whether they took turns."""

from __future__ import annotations

from typing import Any

import dagster as dg

from kimi_batch.defs.partitions import DATE_DIMENSION, SOURCE_DIMENSION
from kimi_batch_tests.support.graphql import GraphQL

__all__ = ["POOL_DAY", "assert_one_after_the_other", "partition", "run_two_partitions_together"]

POOL_DAY = "2025-06-01"


def partition(source: str, day: str = POOL_DAY) -> dg.MultiPartitionKey:
    return dg.MultiPartitionKey({DATE_DIMENSION: day, SOURCE_DIMENSION: source})


def run_two_partitions_together(
    graphql: GraphQL,
    job: str,
    sources: tuple[str, str],
    *,
    timeout_s: float,
    run_config: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Queue `job` for two partitions back to back; both runs once ended, in start order."""
    for source in sources:
        graphql.add_dynamic_partition("source", source)
    run_ids = [
        graphql.launch_partition_run(job, partition(source), run_config) for source in sources
    ]
    runs = [graphql.wait_run(run_id, timeout_s) for run_id in run_ids]
    for run in runs:
        assert run["status"] == "SUCCESS", graphql.run_errors(run["runId"])
    return sorted(runs, key=lambda run: run["startTime"])


def assert_one_after_the_other(runs: list[dict[str, Any]]) -> None:
    first, second = runs
    assert first["endTime"] is not None
    assert second["startTime"] is not None
    assert first["endTime"] <= second["startTime"], (
        f"runs overlapped: first {first['startTime']:.1f}-{first['endTime']:.1f}, "
        f"second started {second['startTime']:.1f}"
    )
