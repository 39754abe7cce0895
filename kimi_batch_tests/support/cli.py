"""`kimi-batch` in a child process with a state dir of its own, and the one-line-error contract."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

__all__ = ["CLI_TIMEOUT_S", "assert_one_error_line", "run_cli"]

# A guard against a hung command, not a speed bound: beside the llama-server tests `make test`
# runs the server-free tier niced on 2 cores, where a command's imports alone (the warehouse's
# pyiceberg and pyarrow: 4 s of CPU when idle) have taken over a minute.
CLI_TIMEOUT_S = 300


def run_cli(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`kimi-batch ARGS` in a child process with its own state dir; nothing is left running."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KIMI_BATCH_")}
    return subprocess.run(
        [sys.executable, "-m", "kimi_batch.cli", *args],
        env={**clean, "KIMI_BATCH_HOME": str(tmp_path / "home"), **env},
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )


def assert_one_error_line(result: subprocess.CompletedProcess[str], *expected: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("kimi-batch"), lines[0]
    assert "Traceback" not in result.stderr
    for text in expected:
        assert text in lines[0]
