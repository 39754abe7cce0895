"""Inbox files as a user drops them: written, then aged past the sensor's settle time."""

from __future__ import annotations

import os
import time
from pathlib import Path

__all__ = ["put"]


def put(path: Path, text: str = '{"prompt": "hi"}\n', *, age_s: float = 60.0) -> Path:
    """Write a settled file (mtime `age_s` ago, older than the sensor's settle time)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    past = time.time() - age_s
    os.utime(path, (past, past))
    return path
