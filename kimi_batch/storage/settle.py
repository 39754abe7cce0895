"""Whether an inbox file has stopped changing: a copy in progress is never landed half."""

from __future__ import annotations

import os
import time
from pathlib import Path

from kimi_batch.storage.exceptions import StorageError

# A file whose size or mtime changed this recently may still be being written (a copy in
# progress): landing waits for it rather than snapshot half of it. The sensor uses the same.
SETTLE_S = 5.0


class InputNotSettledError(StorageError):
    """The inbox file changed within the settle period, or while it was copied: not landed."""


def still_changing(size_mtime: tuple[int, int], now_ns: int, settle_s: float = SETTLE_S) -> bool:
    """True when a file of (size, mtime_ns) may still be being written: modified within the last
    `settle_s` seconds (or dated in the future, where the mtime says nothing)."""
    age_s = (now_ns - size_mtime[1]) / 1e9
    return age_s < 0 or age_s < settle_s


def wait_until_settled(
    path: Path | int, size_mtime: tuple[int, int], settle_s: float = SETTLE_S
) -> bool:
    """True once the file's (size, mtime) has stood still for `settle_s`, waiting at most that
    long; False when it changed meanwhile (a copy still in progress) or vanished. `path` may be
    an open descriptor (what is being copied, whatever the name now leads to)."""
    if not still_changing(size_mtime, time.time_ns(), settle_s):
        return True
    age_s = (time.time_ns() - size_mtime[1]) / 1e9
    time.sleep(settle_s - age_s if 0 <= age_s < settle_s else settle_s)
    try:
        return size_mtime_of(os.stat(path)) == size_mtime
    except FileNotFoundError:
        return False


def size_mtime_of(status: os.stat_result) -> tuple[int, int]:
    """What `still_changing` compares: (size, mtime_ns)."""
    return status.st_size, status.st_mtime_ns
