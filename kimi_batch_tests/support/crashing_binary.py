"""Stand-ins for a llama-server binary that dies the way a bad build does, for what a real server
cannot be made to do on demand: crash by a signal at start (an AMX build on a Xeon), or exit."""

from __future__ import annotations

from pathlib import Path

__all__ = ["crashing_binary", "exiting_binary"]


def _script(path: Path, body: str) -> Path:
    path.write_text(f"#!/bin/sh\necho 'llama-server stand-in: loading model'\n{body}\n")
    path.chmod(0o755)
    return path


def crashing_binary(folder: Path, signal: str = "SEGV") -> Path:
    """An executable that prints a log line and then kills itself with SIG`signal`."""
    return _script(folder / f"llama-server-sig{signal.lower()}", f"kill -{signal} $$")


def exiting_binary(folder: Path, code: int) -> Path:
    """An executable that prints an error line and exits with `code` (an ordinary failure)."""
    return _script(folder / f"llama-server-exit{code}", f"echo 'error: bad flag' >&2\nexit {code}")
