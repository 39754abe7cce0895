"""Inbox files as a user drops them (written, then aged past the sensor's settle time), and the
fresh state dir's inbox they go to (a pytest plugin: the `inbox` fixture)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

__all__ = ["inbox", "put"]


def put(path: Path, text: str = '{"prompt": "hi"}\n', *, age_s: float = 60.0) -> Path:
    """Write a settled file (mtime `age_s` ago, older than the sensor's settle time)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    past = time.time() - age_s
    os.utime(path, (past, past))
    return path


@pytest.fixture
def inbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The empty inbox of a fresh state dir (`KIMI_BATCH_HOME` set to the test's temp dir)."""
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path))
    path = tmp_path / "inbox"
    path.mkdir()
    return path
