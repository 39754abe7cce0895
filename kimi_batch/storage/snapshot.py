"""One version of an input file copied into the landed folder, hashed while it is copied."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import BinaryIO

from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.crash_points import crash_point
from kimi_batch.paths import PRIVATE_FILE_MODE
from kimi_batch.storage.exceptions import StorageError
from kimi_batch.storage.private_files import remove_stale_temps, temp_name
from kimi_batch.storage.settle import (
    SETTLE_S,
    InputNotSettledError,
    size_mtime_of,
    wait_until_settled,
)

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
