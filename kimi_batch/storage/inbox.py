"""The inbox: which input files are there, which batch partition each belongs to, and their hash.

Layout (`$KIMI_BATCH_HOME/inbox/`)::

    inbox/seeds.jsonl                 ds = the file's mtime as a UTC date
    inbox/2025-06-01/questions.csv    ds = 2025-06-01 (the dated folder wins over the mtime)

Only the inbox itself and its `YYYY-MM-DD/` folders are read: other folders (`processed/`, a
staging area...) are left alone, as are dotfiles, editor/partial-upload names and unknown
extensions, so uploads written under a temporary name and renamed at the end are never seen half
written.

A file's partition is (ds, source): source is the file stem in `[a-z0-9_]`. When two files of the
same day would get the same source (`seeds.jsonl` next to `seeds.csv`), each gets its extension
appended (`seeds_jsonl`, `seeds_csv`); what still collides after that gets a short hash of its
inbox path. The mapping depends only on the files of that day, so the sensor (which requests the
partition) and `seed_prompts` (which calls `resolve_source_file`) agree on it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, date, datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.errors import MissingInputError

__all__ = [
    "INBOX_EXTENSIONS",
    "InboxFile",
    "file_sha256",
    "inbox_files_for_ds",
    "is_ignored_name",
    "resolve_source_file",
    "sanitize_source",
    "scan_inbox",
]

# Kept equal to kimi_batch.tasks.inputs.SUPPORTED_EXTENSIONS; not imported from there so that the
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

_log = logging.getLogger(__name__)


class InboxFile(BaseModel):
    """One input file in the inbox and the batch partition it belongs to."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: Path = Field(description="Absolute path of the file.")
    name: str = Field(
        min_length=1, description="Path relative to the inbox, POSIX style (unique per file)."
    )
    source: str = Field(pattern=r"^[a-z0-9_]+$", description="Source partition key.")
    ds: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}$", description="Date partition key.")
    size: int = Field(ge=0)
    mtime_ns: int
    sha256: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{64}$",
        description="Content hash; None until `hashed()` is called (hashing reads the file).",
    )

    def hashed(self) -> InboxFile:
        """This file with `sha256` filled in; raises `OSError` when the file cannot be read."""
        if self.sha256 is not None:
            return self
        return self.model_copy(update={"sha256": file_sha256(self.path)})


def file_sha256(path: Path) -> str:
    """SHA-256 of the file's bytes, read in 1 MiB chunks (inputs can be gigabytes)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def is_ignored_name(name: str) -> bool:
    """True for dotfiles, temporary/partial-upload names and extensions the reader does not know."""
    lowered = name.lower()
    if lowered.startswith(_IGNORED_PREFIXES) or lowered.endswith(_IGNORED_SUFFIXES):
        return True
    return Path(lowered).suffix not in INBOX_EXTENSIONS


def sanitize_source(stem: str) -> str:
    """A file stem as a source key: lowercase, runs of other characters as one `_`.

    A stem with nothing usable (`日本.jsonl`) gets a name from its hash rather than failing, and
    overlong stems are cut and suffixed with their hash so they stay unique.
    """
    cleaned = _NOT_SOURCE_CHARS.sub("_", stem.lower()).strip("_")
    if not cleaned:
        return f"file_{_short_hash(stem)}"
    if len(cleaned) > _MAX_SOURCE_LEN:
        return f"{cleaned[:_MAX_SOURCE_LEN].rstrip('_')}_{_short_hash(stem)}"
    return cleaned


def scan_inbox(inbox_dir: Path) -> list[InboxFile]:
    """Every input file in the inbox with its (ds, source); no file is read, only stat'ed.

    A missing inbox is an empty one; files that vanish between listing and stat are skipped.
    Sorted by `name`, so repeated scans of the same files give the same list.
    """
    if not inbox_dir.is_dir():
        return []
    found: list[tuple[Path, str, str, os.stat_result]] = []
    for path, name, dated in _candidates(inbox_dir):
        try:
            stat = path.stat()  # follows symlinks: a symlinked upload is the file it points to
        except FileNotFoundError:
            continue
        except OSError as error:
            _log.warning("inbox: cannot stat %s: %s", name, error)
            continue
        ds = dated or _utc_date(stat.st_mtime_ns)
        found.append((path, name, ds, stat))
    sources = _assign_sources([(name, ds) for _, name, ds, _ in found])
    files = [
        InboxFile(
            path=path,
            name=name,
            source=sources[name],
            ds=ds,
            size=stat.st_size,
            mtime_ns=stat.st_mtime_ns,
        )
        for path, name, ds, stat in found
    ]
    return sorted(files, key=lambda item: item.name)


def inbox_files_for_ds(inbox_dir: Path, ds: str) -> list[InboxFile]:
    """The inbox files whose date partition is `ds`."""
    return [item for item in scan_inbox(inbox_dir) if item.ds == ds]


def resolve_source_file(inbox_dir: Path, ds: str, source: str) -> Path:
    """The file behind partition (ds, source); FileNotFoundError names the partition if none.

    Besides the exact mapping, a file also matches by its extended name (`seeds_jsonl`), so a
    partition created while `seeds.jsonl` shared its day with `seeds.csv` still finds its file
    after the CSV is removed.
    """
    candidates = inbox_files_for_ds(inbox_dir, ds)
    for item in candidates:
        if item.source == source:
            return item.path
    for item in candidates:
        if _with_extension(Path(item.name)) == source:
            return item.path
    known = ", ".join(sorted(item.source for item in candidates)) or "none"
    raise MissingInputError(
        f"no inbox file for partition date={ds} source={source} in {inbox_dir} "
        f"(sources of that day: {known})"
    )


# ---- internals ---------------------------------------------------------------------------------


def _candidates(inbox_dir: Path) -> Iterator[tuple[Path, str, str | None]]:
    """(path, name relative to the inbox, ds of its dated folder or None) of every candidate."""
    for entry in _scandir(inbox_dir):
        if entry.is_dir(follow_symlinks=True):
            if _DATED_FOLDER.match(entry.name) and _is_date(entry.name):
                for inner in _scandir(Path(entry.path)):
                    if _is_candidate(inner):
                        yield Path(inner.path), f"{entry.name}/{inner.name}", entry.name
        elif _is_candidate(entry):
            yield Path(entry.path), entry.name, None


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
        # A directory or fifo named like an input is not an input (and reading a fifo blocks).
        return entry.is_file(follow_symlinks=True)
    except OSError:
        return False


def _is_date(text: str) -> bool:
    try:
        date.fromisoformat(text)
    except ValueError:
        return False
    return True


def _utc_date(mtime_ns: int) -> str:
    return datetime.fromtimestamp(mtime_ns / 1e9, UTC).date().isoformat()


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]


def _with_extension(name: Path) -> str:
    return sanitize_source(f"{name.stem}_{name.suffix.lstrip('.')}")


def _assign_sources(files: list[tuple[str, str]]) -> dict[str, str]:
    """Source key per file name, unique within each ds (see the module docstring)."""
    by_day: dict[str, list[str]] = defaultdict(list)
    for name, ds in files:
        by_day[ds].append(name)
    sources: dict[str, str] = {}
    for names in by_day.values():
        proposed: dict[str, str] = {}
        by_stem: dict[str, list[str]] = defaultdict(list)
        for name in names:
            by_stem[sanitize_source(Path(name).stem)].append(name)
        for stem, group in by_stem.items():
            for name in group:
                proposed[name] = stem if len(group) == 1 else _with_extension(Path(name))
        # Whatever still collides (same stem and extension in the root and a dated folder, or
        # `seeds_jsonl.csv` next to `seeds.jsonl` + `seeds.csv`) is told apart by its path.
        counts: dict[str, int] = defaultdict(int)
        for source in proposed.values():
            counts[source] += 1
        for name, source in proposed.items():
            if counts[source] > 1:
                source = sanitize_source(f"{source}_{_short_hash(name)}")
            sources[name] = source
    return sources
