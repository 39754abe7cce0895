"""Where each partition of a night stands, as `status` and the morning alerts read it."""

from __future__ import annotations

import json

import dagster as dg

from kimi_batch.defs.jobs import (
    FAILED_PARTITIONS_TAG,
    NIGHTLY_JOB_NAME,
    STOPPED_TAG,
    nightly_run_config,
)
from kimi_batch.defs.partition_states import distill_states
from kimi_batch.pipeline import PartitionState

LEASED, STOPPED, LATE = "2025-06-01|alpha", "2025-06-01|beta", "2025-06-01|gamma"


def test_a_night_stopped_at_the_window_names_its_own_failures_as_failed() -> None:
    """The run's stopped tag made every partition of it 'stopped at window, resumes next
    night', a partition whose lease another run held too: its reason was lost."""
    with dg.instance_for_test() as instance:
        failed_own = {LEASED}
        instance.add_run(
            dg.DagsterRun(
                job_name=NIGHTLY_JOB_NAME,
                run_id="night-stopped",
                run_config=nightly_run_config([LEASED, STOPPED]),
                status=dg.DagsterRunStatus.FAILURE,
                tags={STOPPED_TAG: "true", FAILED_PARTITIONS_TAG: json.dumps(sorted(failed_own))},
            )
        )
        instance.add_run(  # an older version's stopped night: no list, every partition stopped
            dg.DagsterRun(
                job_name=NIGHTLY_JOB_NAME,
                run_id="night-older",
                run_config=nightly_run_config([LATE]),
                status=dg.DagsterRunStatus.FAILURE,
                tags={STOPPED_TAG: "true"},
            )
        )
        states = distill_states(instance, [LEASED, STOPPED, LATE])
    assert {key: record.state for key, record in states.items()} == {
        LEASED: PartitionState.FAILED,
        STOPPED: PartitionState.STOPPED_AT_WINDOW,
        LATE: PartitionState.STOPPED_AT_WINDOW,
    }
