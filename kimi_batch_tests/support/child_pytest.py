"""A pytest run in a child process: how a test shows that a guard plugin fails a bad test,
without failing the run it belongs to."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from kimi_batch_tests.support.repo import REPO_ROOT

__all__ = ["run_child_pytest"]


def run_child_pytest(test_file: Path, source: str, *, plugin: str) -> str:
    """Writes `source` to `test_file` and runs it in a child pytest with only the support plugin
    `plugin` (`-q -rA`, no cache, its folder as cwd and HOME); returns its output, asserting the
    run failed (exit status 1: a guard's failure is what these runs are for)."""
    test_file.write_text(source)
    done = subprocess.run(
        [
            *(sys.executable, "-m", "pytest"),
            *("-p", plugin, "-p", "no:cacheprovider", "-q", "-rA"),
            str(test_file),
        ],
        cwd=test_file.parent,
        env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin", "HOME": str(test_file.parent)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    return done.stdout
