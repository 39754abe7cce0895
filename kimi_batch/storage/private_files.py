"""Files holding prompts or answers: read only when they are regular files, written owner-only
and whole, no temp file left for ever.

    open_regular(path)       `path` opened for reading if it is a regular file, never blocking
                             on a FIFO (`NotRegularFileError` otherwise)
    private_folder(path)     create it 0700 (an existing folder of someone else is left alone)
    temp_name(folder, name)  a hidden temp name carrying the writer's pid
    remove_stale_temps(dir)  the temps of writers that are gone (killed mid-write)
    write_private_text(p, t) write `t` to a temp, fsync, 0600, rename over `p`
    private_writer(p)        the same, streamed: lines written as they come, renamed at the end
    private_folder_swap(p)   a folder filled in a hidden temp folder (0700), renamed over `p`

A write goes to a temp file first and is renamed into place, so a reader never sees half a file;
a writer killed in between leaves its temp behind. Its name carries the writer's pid, so the next
write into the same folder removes the temps of dead writers (never a live writer's). Nothing
else is touched: an export's folder may be the user's own (their editor's `.x.tmp` stays), and
an entry that cannot be removed (another user's, in a shared folder) is left where it is.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import stat
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, TextIO

from kimi_batch.crash_points import crash_point
from kimi_batch.paths import PRIVATE_DIR_MODE, PRIVATE_FILE_MODE

# `.<name>.<pid>-<32 hex>[.<n>].tmp|.chunk`: what temp_name writes (and its numbered chunks).
_WITH_PID = re.compile(r"^\..*\.(\d+)-[0-9a-f]{32}(?:\.\d+)?\.(?:tmp|chunk)$")


REFUSED_SPECIAL = "not a regular file (a FIFO, socket or device); it is never read"


class NotRegularFileError(OSError):
    """The name is (or leads to) a FIFO, socket or device: reading it could block forever."""


def open_regular(path: Path) -> BinaryIO:
    """`path` opened for reading if it is a regular file (through symlinks), without blocking.

    O_NONBLOCK makes opening a FIFO return at once instead of waiting for a writer; the fstat
    of the open descriptor then refuses it (the name may have been swapped since any stat).
    """
    return regular_file(os.open(path, os.O_RDONLY | os.O_NONBLOCK), path.name)


def regular_file(descriptor: int, name: str) -> BinaryIO:
    """The open `descriptor` as a blocking binary file if it is a regular file; closed and
    NotRegularFileError otherwise (checked on the descriptor: the name may have been swapped)."""
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise NotRegularFileError(f"{name}: {REFUSED_SPECIAL}")
        os.set_blocking(descriptor, True)
        return os.fdopen(descriptor, "rb")
    except BaseException:
        os.close(descriptor)
        raise


def pid_alive(pid: int) -> bool:
    """Whether a process `pid` exists on this host (another user's counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def private_folder(path: Path) -> Path:
    """Create `path` and its missing parents 0700; an existing folder keeps its mode (it may be
    a shared one the user named, such as /tmp)."""
    missing: list[Path] = []
    probe = path
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    path.mkdir(parents=True, exist_ok=True)
    for created in missing:
        os.chmod(created, PRIVATE_DIR_MODE)
    return path


def temp_name(folder: Path, name: str, suffix: str = ".tmp") -> Path:
    """A fresh hidden temp path for `name` in `folder`, naming this process."""
    return folder / f".{name}.{os.getpid()}-{uuid.uuid4().hex}{suffix}"


def remove_stale_temps(folder: Path) -> list[Path]:
    """Remove the temp files left in `folder` by writers that no longer run; returns them."""
    removed: list[Path] = []
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return removed
    for entry in entries:
        match = _WITH_PID.match(entry.name)
        if match is None:
            continue  # not a temp this package names: never ours to remove
        pid = int(match.group(1))
        try:
            if pid != os.getpid() and not pid_alive(pid) and entry.is_file(follow_symlinks=False):
                os.unlink(entry.path)
                removed.append(Path(entry.path))
        except OSError:
            continue  # removed by another writer first, or not ours to remove (EPERM)
    return removed


@contextmanager
def private_writer(path: Path) -> Iterator[TextIO]:
    """A text writer whose file appears at `path` whole (0600, folder created 0700) when the
    block ends; an exception (or a kill) inside the block leaves `path` as it was."""
    folder = private_folder(path.parent)
    remove_stale_temps(folder)
    temp = temp_name(folder, path.name)
    try:
        descriptor = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE_MODE)
        with os.fdopen(descriptor, "w", encoding="utf-8") as writer:
            yield writer
            writer.flush()
            os.fsync(writer.fileno())
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)
    # The rename brings the temp's inode (0600; a umask only narrows it) over any older file.


def write_private_text(path: Path, text: str) -> Path:
    """Write `text` to `path` whole (temp, fsync, rename), 0600, its folder created 0700."""
    with private_writer(path) as writer:
        writer.write(text)
    return path


def _dead_writers_folders(parent: Path, pattern: str) -> list[Path]:
    """The folders (or links to one: an `--out` the user made a link) matching `pattern` in
    `parent` whose writer no longer runs, newest first."""
    found: list[Path] = []
    for entry in parent.glob(pattern):
        match = _WITH_PID.match(entry.name)
        pid = int(match.group(1)) if match else os.getpid()
        if pid != os.getpid() and not pid_alive(pid) and (entry.is_dir() or entry.is_symlink()):
            found.append(entry)
    return sorted(found, key=lambda entry: entry.lstat().st_ctime_ns, reverse=True)


def _remove_folder(path: Path) -> None:
    """Remove a temp folder, or only the link where it is one (never what a link points at)."""
    if path.is_symlink():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)


def _remove_stale_temp_folders(parent: Path, name: str) -> None:
    """The temp folders of `name` left by writers that no longer run. A swap killed between
    its two renames left `name` moved aside and nothing in its place: it is put back first."""
    # The name is the user's (`--out run[1].hf`): its glob characters are matched as written.
    literal = glob.escape(name)
    if not (parent / name).exists() and not (parent / name).is_symlink():
        for aside in _dead_writers_folders(parent, f".{literal}.old.*.tmp")[:1]:
            os.replace(aside, parent / name)
    for entry in _dead_writers_folders(parent, f".{literal}.*.tmp"):
        _remove_folder(entry)


def _fsync_tree(folder: Path) -> None:
    """Every file and folder under `folder`, and `folder` itself, on disk."""
    for path in [*sorted(folder.rglob("*"), reverse=True), folder]:
        descriptor = os.open(path, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


@contextmanager
def private_folder_swap(path: Path) -> Iterator[Path]:
    """A fresh hidden folder (0700) to fill; when the block ends its files are synced and it
    replaces `path` (an older folder there is moved aside, then removed after the rename). An
    exception or a kill inside the block leaves `path` as it was; the next swap removes a dead
    writer's temp, and puts back the older folder a swap killed between its renames left aside."""
    parent = private_folder(path.parent)
    _remove_stale_temp_folders(parent, path.name)
    temp = temp_name(parent, path.name)
    old = temp_name(parent, f"{path.name}.old")
    temp.mkdir(mode=PRIVATE_DIR_MODE)
    try:
        yield temp
        _fsync_tree(temp)
        if path.exists() or path.is_symlink():
            os.replace(path, old)
            crash_point("export.folder_set_aside")  # nothing at `path` until the next rename
        os.replace(temp, path)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
        if (old.exists() or old.is_symlink()) and not (path.exists() or path.is_symlink()):
            os.replace(old, path)  # stopped between the two renames: the older folder stays
        _remove_folder(old)
