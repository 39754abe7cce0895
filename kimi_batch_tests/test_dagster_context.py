"""The guard that fails a test leaving a Dagster instance's context open (support plugin)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from kimi_batch_tests.support.repo import REPO_ROOT

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
    (tmp_path / "test_leak.py").write_text(LEAKING)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "kimi_batch_tests.support.dagster_context",
            "-p",
            "no:cacheprovider",
            "-q",
            "-rA",
            str(tmp_path / "test_leak.py"),
        ],
        cwd=tmp_path,
        env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "2 passed, 1 error" in done.stdout, done.stdout
    assert "ERROR test_leak.py::test_reads_a_schedule_context_and_never_closes_it" in done.stdout
    assert "left a Dagster instance's context open" in done.stdout
    assert "PASSED test_leak.py::test_closes_its_schedule_context" in done.stdout
