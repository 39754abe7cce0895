"""An input file landed whole: whether it has stopped changing (a copy in progress is never landed
half), then one version of it copied into the landed folder, hashed while it is copied."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import BinaryIO

from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.crash_points import crash_point
from kimi_batch.paths import PRIVATE_FILE_MODE
from kimi_batch.storage import StorageError, remove_stale_temps, temp_name

# ---- whether a file has settled -----------------------------------------------------------------


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


# ---- the snapshot copy --------------------------------------------------------------------------


_COPY_CHUNK = 1 << 20


class InputTooLargeError(StorageError):
    """An input file is over the configured size limit; it is refused before it is read."""


class Snapshot(BaseModel):
    """A content-addressed copy: `<landed_dir>/<sha256>.<ext>`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    ext: str
    size: int = Field(ge=0)


def copy_snapshot(
    reader: BinaryIO,
    landed_dir: Path,
    *,
    name: str,
    max_bytes: int,
    ext: str,
    settle_s: float = SETTLE_S,
) -> Snapshot:
    """Copy the open file `reader` (inbox file `name`, from its start) to
    `landed_dir/<sha256>.<ext>`, fsynced, owner-only.

    Every look at the file is through the open descriptor (fstat, read): a name swapped after
    it was opened changes nothing here (`inbox.open_inbox_file` opened it without following a
    link out of the inbox). The size is checked before a byte is read and again while copying
    (a file growing during the copy is refused too). A file modified within the last `settle_s`
    is watched until its size and mtime have stood still that long; one that moves meanwhile,
    or while it is copied, raises InputNotSettledError. An OSError of the copy (disk full, I/O
    error) leaves no file behind.
    """
    remove_stale_temps(landed_dir)  # those of a copy killed midway (named by pid)
    temp = temp_name(landed_dir, "snapshot")
    digest = hashlib.sha256()
    copied = 0
    descriptor = reader.fileno()
    try:
        before = size_mtime_of(os.fstat(descriptor))
        if before[0] > max_bytes:
            raise InputTooLargeError(_too_large(before[0], max_bytes))
        if not wait_until_settled(descriptor, before, settle_s):
            raise InputNotSettledError(
                f"{name} is still changing (its size or mtime moved within "
                f"{settle_s:g} s); it lands once it has stopped changing"
            )
        with temp.open("wb") as writer:
            os.chmod(temp, PRIVATE_FILE_MODE)
            while chunk := reader.read(_COPY_CHUNK):
                copied += len(chunk)
                if copied > max_bytes:
                    raise InputTooLargeError(_too_large(copied, max_bytes))
                digest.update(chunk)
                writer.write(chunk)
            writer.flush()
            os.fsync(writer.fileno())
        after = size_mtime_of(os.fstat(descriptor))
        if after != before or copied != before[0]:
            raise InputNotSettledError(
                f"{name} is still changing (it went from {before[0]} to "
                f"{after[0]} bytes while it was copied); it lands once it has stopped "
                "changing"
            )
        sha256 = digest.hexdigest()
        target = landed_dir / f"{sha256}.{ext}"
        if not target.exists():
            os.replace(temp, target)
            crash_point("landing.snapshot_copied")
    finally:
        temp.unlink(missing_ok=True)
    return Snapshot(sha256=sha256, ext=ext, size=copied)


def _too_large(size: int, limit: int) -> str:
    return (
        f"file is {size / 2**20:.1f} MiB, over the {limit / 2**20:.0f} MiB limit "
        "(KIMI_BATCH_MAX_INPUT_MB); split it or raise the limit"
    )
