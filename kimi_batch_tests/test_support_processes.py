"""Test support's process helpers (`support/processes.py`) that the suite's timing relies on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from kimi_batch_tests.support.processes import keep_niceness
from kimi_batch_tests.support.repo import REPO_ROOT

# In a process niced by 7 more than the test: start a session of its own, keep the niceness, print
# the process's niceness and its new session's autogroup.
_NICED_CHILD = """
import os, subprocess
from kimi_batch_tests.support.processes import keep_niceness
child = subprocess.Popen(["sleep", "30"], start_new_session=True)
try:
    keep_niceness(child.pid)
    print(os.nice(0), open(f"/proc/{child.pid}/autogroup").read())
finally:
    child.kill()
"""


def test_a_session_a_niced_process_starts_keeps_its_niceness() -> None:
    """The kernel starts a new session's autogroup at nice 0: without `keep_niceness`, a Dagster
    stack that make test's niced second tier starts competed at full weight with the first."""
    if not Path("/proc/self/autogroup").exists():  # a kernel without autogroups: a no-op
        keep_niceness(1)
        return
    run = subprocess.run(
        ["nice", "-n", "7", sys.executable, "-c", _NICED_CHILD],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=REPO_ROOT,
    )
    assert run.returncode == 0, run.stderr
    # The test may itself run niced (make test's second tier is): the child is 7 above it.
    niceness, _group, word, group_niceness = run.stdout.split()
    assert int(niceness) == min(os.nice(0) + 7, 19), run.stdout
    assert (word, group_niceness) == ("nice", niceness), run.stdout
