"""A server the tests start for the session through its repo script (`scripts/<name>.sh`:
`start`, `stop` and read-only commands such as `url` or `env`)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

__all__ = ["run_script", "script_server"]


def run_script(
    script: Path, command: str, env: dict[str, str], timeout_s: float
) -> subprocess.CompletedProcess[str]:
    """One command of the script, its output captured (never raises on its exit code)."""
    return subprocess.run(
        [str(script), command],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


@contextmanager
def script_server(
    script: Path, env: dict[str, str], *, log: Path, timeout_s: float
) -> Iterator[Callable[[str], str]]:
    """Start the server (fail the test with the script's error and the log's tail, never skip),
    hand out a runner of the script's other commands (their stdout), stop it at the end."""
    started = run_script(script, "start", env, timeout_s)
    if started.returncode != 0:
        run_script(script, "stop", env, timeout_s)
        tail = log.read_text(errors="replace")[-3000:] if log.exists() else f"(no {log.name})"
        pytest.fail(
            f"scripts/{script.name} start failed ({started.returncode}):\n{started.stderr}\n{tail}",
            pytrace=False,
        )
    try:
        yield lambda command: run_script(script, command, env, timeout_s).stdout
    finally:
        run_script(script, "stop", env, timeout_s)
