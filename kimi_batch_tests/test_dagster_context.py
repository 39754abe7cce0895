"""The guard that fails a test leaving a Dagster instance's context open (support plugin)."""

from __future__ import annotations

from pathlib import Path

from kimi_batch_tests.support.child_pytest import run_child_pytest

LEAKING = """
import dagster as dg

# Held, as a reference cycle holds a real one until the collector runs (maybe tests later).
KEPT = []

def test_reads_a_schedule_context_and_never_closes_it(tmp_path):
    instance = dg.DagsterInstance.from_config(str(tmp_path))
    context = dg.build_schedule_context(instance=instance)
    assert context.instance is not None  # opens an instance from the ref, left open
    KEPT.append(context)

def test_closes_its_schedule_context(tmp_path):
    instance = dg.DagsterInstance.from_config(str(tmp_path))
    with dg.build_schedule_context(instance=instance) as context:
        assert context.instance is not None
"""


def test_a_test_that_leaves_a_schedule_context_open_fails_and_the_next_one_is_untouched(
    tmp_path: Path,
) -> None:
    output = run_child_pytest(
        tmp_path / "test_leak.py", LEAKING, plugin="kimi_batch_tests.support.dagster_context"
    )
    assert "2 passed, 1 error" in output, output
    assert "ERROR test_leak.py::test_reads_a_schedule_context_and_never_closes_it" in output
    assert "left a Dagster instance's context open" in output
    assert "PASSED test_leak.py::test_closes_its_schedule_context" in output
