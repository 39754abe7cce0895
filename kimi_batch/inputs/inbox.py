"""The inbox: which input files are there (stat only), and which must be refused unread.

Layout (`$KIMI_BATCH_HOME/inbox/`)::

    inbox/seeds.jsonl                 an undated file: its date is the day it arrived
    inbox/2025-06-01/questions.csv    a dated folder: its date is the folder's

Only the inbox itself and its `YYYY-MM-DD/` folders are read: other folders (`processed/`, a
staging area...) are left alone, as are dotfiles, editor/partial-upload names and unknown
extensions, so uploads written under a temporary name and renamed at the end are never seen half
written. Which partition a file belongs to is decided once, when it is first seen, by the landing
manifest (`kimi_batch.inputs.landing`); this module only lists and inspects.

Three kinds of entries are refused without reading a byte of them, and quarantined with the
reason: a name that is not valid UTF-8 (it is shown by a safe, escaped name), a symlink whose
target lies outside the inbox (`ln -s ~/.env inbox/x.jsonl` must not publish the target's lines),
and a name that is (or links to) a FIFO, socket or device: opening a FIFO blocks until a writer
comes. A dated folder that is a symlink out of the inbox is not listed at all.

Those checks are made when the inbox is listed; a name can be swapped for a link after that. So
an inbox file is read only through `open_inbox_file`: each component opened from the inbox's own
directory descriptor with O_NOFOLLOW (never through a link it did not check), a link inside the
inbox followed only to its real path inside it, then the open descriptor fstat'ed (a regular
file) and hashed or copied from that same descriptor. A FIFO or a link swapped in after the scan
is refused with the reason, and not a byte of a file outside the inbox is read.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import re
import stat
from collections.abc import Iterator
from datetime import date
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.storage import REFUSED_SPECIAL, open_regular, regular_file

# Kept equal to kimi_batch.inputs.reader.SUPPORTED_EXTENSIONS; not imported from there so that the
# sensor, which runs in the Dagster daemon on every tick, does not import polars and pydantic
# row models it never uses.
INBOX_EXTENSIONS: tuple[str, ...] = (".jsonl", ".ndjson", ".json", ".parquet", ".csv")
_IGNORED_PREFIXES = (".", "~", "#")
# Names browsers, rsync and editors give files while they are still being written.
_IGNORED_SUFFIXES = (".tmp", ".part", ".partial", ".crdownload", ".swp", "~")
_DATED_FOLDER = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_NOT_SOURCE_CHARS = re.compile(r"[^a-z0-9]+")
_MAX_SOURCE_LEN = 80
_HASH_CHUNK = 1 << 20
REFUSED_NAME = "file name is not valid UTF-8; rename it"
REFUSED_LINK = "symlink resolves outside the inbox; its content is never read"
REFUSED_SWAPPED = "became a symlink while it was opened; its content is never read"

_log = logging.getLogger(__name__)


class InboxFile(BaseModel):
    """One input file in the inbox."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: Path = Field(description="Absolute path of the file.")
    name: str = Field(
        min_length=1,
        description="Path relative to the inbox, POSIX style; undecodable bytes escaped (\\xe9).",
    )
    dated_ds: str | None = Field(
        default=None, pattern=r"^\d{4}-\d{2}-\d{2}$", description="Date of its dated folder."
    )
    size: int = Field(ge=0)
    mtime_ns: int
    refused: str | None = Field(default=None, description="Why it is refused unread, if it is.")
    sha256: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{64}$",
        description="Content hash; None until `hashed()` is called (hashing reads the file).",
    )

    def hashed(self) -> InboxFile:
        """This file with `sha256` filled in; raises `OSError` when the file cannot be read."""
        if self.sha256 is not None:
            return self
        if self.refused is not None:
            raise PermissionError(self.refused)
        with self.open() as handle:
            return self.model_copy(update={"sha256": sha256_of(handle)})

    def open(self) -> BinaryIO:
        """The file opened for reading by `open_inbox_file` (never through a link out)."""
        if self.refused is not None:
            raise PermissionError(self.refused)
        # `path` is the inbox folder joined with `name` (an unrefused name is the raw one).
        inbox_dir = self.path.parents[len(PurePosixPath(self.name).parts) - 1]
        return open_inbox_file(inbox_dir, self.name)


class InboxLinkError(PermissionError):
    """The name leads out of the inbox (a symlink, perhaps swapped in after the scan)."""


def open_inbox_file(inbox_dir: Path, name: str) -> BinaryIO:
    """Inbox file `name` opened for reading, never through a link that leaves the inbox.

    Every component is opened from the inbox's directory descriptor with O_NOFOLLOW, so what is
    opened is what lies in the inbox now, whatever was swapped in since a check. A link inside
    the inbox (`big.jsonl -> staging/big.jsonl`) is followed by resolving it and opening its real
    path the same way; a link whose target is outside raises InboxLinkError, as does a path that
    changes into a link while it is opened. The descriptor must be a regular file
    (NotRegularFileError otherwise; O_NONBLOCK: a FIFO never blocks the open).
    """
    parts = PurePosixPath(name).parts
    if not parts or parts[0] == "/" or any(part in (".", "..") for part in parts):
        raise InboxLinkError(f"{name}: not a name inside the inbox")
    root = os.open(inbox_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            descriptor = _open_beneath(root, parts)
        except OSError as error:
            if error.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            descriptor = _open_beneath(root, _real_parts(inbox_dir, name), resolved=True)
    finally:
        os.close(root)
    return regular_file(descriptor, name)


def _open_beneath(root: int, parts: tuple[str, ...], *, resolved: bool = False) -> int:
    """`parts` opened from directory descriptor `root`, no component followed if it is a link
    (ELOOP, or ENOTDIR for a folder); with `resolved` (a real path) such a link means the path
    changed since it was resolved: InboxLinkError."""
    directory = os.dup(root)
    try:
        for part in parts[:-1]:
            following = os.open(
                part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=directory
            )
            os.close(directory)
            directory = following
        return os.open(parts[-1], os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW, dir_fd=directory)
    except OSError as error:
        if resolved and error.errno in (errno.ELOOP, errno.ENOTDIR):
            raise InboxLinkError(f"{'/'.join(parts)}: {REFUSED_SWAPPED}") from error
        raise
    finally:
        os.close(directory)


def _real_parts(inbox_dir: Path, name: str) -> tuple[str, ...]:
    """The components of `name`'s real path below the inbox; InboxLinkError when it is outside."""
    try:
        root = Path(os.path.realpath(inbox_dir))
        real = Path(os.path.realpath(inbox_dir / name))
    except OSError as error:  # EINVAL: the link became a file while it was resolved
        raise InboxLinkError(f"{name}: {REFUSED_SWAPPED}") from error
    if real == root or not real.is_relative_to(root):
        raise InboxLinkError(f"{name}: {REFUSED_LINK}")
    return real.relative_to(root).parts


def sha256_of(handle: BinaryIO) -> str:
    """SHA-256 of what is left to read in `handle`, in 1 MiB chunks (inputs can be gigabytes)."""
    digest = hashlib.sha256()
    while chunk := handle.read(_HASH_CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    """SHA-256 of the file's bytes; a name that is not a regular file raises
    NotRegularFileError instead of blocking. Not for inbox files: `InboxFile.hashed`."""
    with open_regular(path) as handle:
        return sha256_of(handle)


def is_ignored_name(name: str) -> bool:
    """True for dotfiles, temporary/partial-upload names and extensions the reader does not know."""
    lowered = name.lower()
    if lowered.startswith(_IGNORED_PREFIXES) or lowered.endswith(_IGNORED_SUFFIXES):
        return True
    return Path(lowered).suffix not in INBOX_EXTENSIONS


def short_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]


def sanitize_source(stem: str) -> str:
    """A file stem as a source key: lowercase, runs of other characters as one `_`.

    A stem with nothing usable (`日本.jsonl`) gets a name from its hash rather than failing, and
    overlong stems are cut and suffixed with their hash so they stay unique.
    """
    cleaned = _NOT_SOURCE_CHARS.sub("_", stem.lower()).strip("_")
    if not cleaned:
        return f"file_{short_hash(stem)}"
    if len(cleaned) > _MAX_SOURCE_LEN:
        return f"{cleaned[:_MAX_SOURCE_LEN].rstrip('_')}_{short_hash(stem)}"
    return cleaned


def safe_name(name: str) -> str:
    """`name` with bytes that are not UTF-8 (surrogate-escaped by the OS layer) as `\\xNN`."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def scan_inbox(inbox_dir: Path) -> list[InboxFile]:
    """Every input file in the inbox, sorted by name; no file is read, only stat'ed.

    A missing inbox is an empty one; files that vanish between listing and stat are skipped.
    """
    if not inbox_dir.is_dir():
        return []
    root = inbox_dir.resolve()
    found = [
        item
        for path, dated in _candidates(inbox_dir, root)
        if (item := _inspect(path, inbox_dir, root, dated)) is not None
    ]
    return sorted(found, key=lambda item: item.name)


def inspect_inbox_file(inbox_dir: Path, name: str) -> InboxFile | None:
    """The inbox file called `name` (as `scan_inbox` names it), None when it is not there."""
    path = inbox_dir / name
    parent = Path(name).parent.name
    dated = parent if _DATED_FOLDER.match(parent) and _is_date(parent) else None
    if not os.path.lexists(path):
        return None
    return _inspect(path, inbox_dir, inbox_dir.resolve(), dated)


# ---- internals ---------------------------------------------------------------------------------


def _inspect(path: Path, inbox_dir: Path, root: Path, dated: str | None) -> InboxFile | None:
    raw_name = path.relative_to(inbox_dir).as_posix()
    name = safe_name(raw_name)
    refused = None
    if name != raw_name:
        refused = REFUSED_NAME
    elif not _inside(path, root):
        refused = REFUSED_LINK
    try:
        # lstat for refused entries: not even the target's metadata is needed.
        stat_result = path.lstat() if refused else path.stat()
    except FileNotFoundError:
        return None
    except OSError as error:
        _log.warning("inbox: cannot stat %s: %s", name, error)
        return None
    if refused is None and not stat.S_ISREG(stat_result.st_mode):
        refused = REFUSED_SPECIAL  # a link to a FIFO: hashing or copying it would block
    return InboxFile(
        path=path,
        name=name,
        dated_ds=dated,
        size=stat_result.st_size,
        mtime_ns=stat_result.st_mtime_ns,
        refused=refused,
    )


def _inside(path: Path, root: Path) -> bool:
    try:
        return path.resolve().is_relative_to(root)
    except (OSError, RuntimeError):  # a symlink loop
        return False


def _candidates(inbox_dir: Path, root: Path) -> Iterator[tuple[Path, str | None]]:
    """(path, date of its dated folder or None) of every candidate."""
    for entry in _scandir(inbox_dir):
        if entry.is_dir(follow_symlinks=True):
            if not (_DATED_FOLDER.match(entry.name) and _is_date(entry.name)):
                continue
            if not _inside(Path(entry.path), root):
                _log.warning(
                    "inbox: dated folder %s resolves outside the inbox; skipped", entry.name
                )
                continue
            for inner in _scandir(Path(entry.path)):
                if _is_candidate(inner):
                    yield Path(entry.path) / inner.name, entry.name
        elif _is_candidate(entry):
            yield Path(entry.path), None


def _scandir(directory: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(directory) as entries:
            return list(entries)
    except FileNotFoundError:
        return []
    except OSError as error:
        _log.warning("inbox: cannot list %s: %s", directory, error)
        return []


def _is_candidate(entry: os.DirEntry[str]) -> bool:
    if is_ignored_name(entry.name):
        return False
    try:
        if entry.is_symlink():
            # A link is a candidate whatever it points to: if it leaves the inbox it is
            # refused (and quarantined) rather than silently ignored.
            return not entry.is_dir(follow_symlinks=True)
        # A directory or fifo named like an input is not an input (and reading a fifo blocks).
        return entry.is_file(follow_symlinks=False)
    except OSError:
        return False


def _is_date(text: str) -> bool:
    try:
        date.fromisoformat(text)
    except ValueError:
        return False
    return True
