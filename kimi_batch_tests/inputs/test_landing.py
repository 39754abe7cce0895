"""Landed inputs on real files and a real manifest: partitions fixed at first sight, snapshots.

The manifest runs on both state backends (`state_backend`: a SQLite file, a PostgreSQL schema)."""

from __future__ import annotations

import errno
import json
import os
import threading
import time
from collections.abc import Iterator
from datetime import date
from pathlib import Path

import pytest

from kimi_batch.inputs.inbox import scan_inbox
from kimi_batch.inputs.landing import InputNotSettledError, InputTooLargeError, Landing
from kimi_batch.inputs.partition_input import LandingIOError, resolve_input
from kimi_batch.paths import StatePaths
from kimi_batch.storage import NotRegularFileError
from kimi_batch.storage.exceptions import StorageError
from kimi_batch_tests.support.postgres import StateBackend

START = date(2025, 1, 1)
DAY1 = date(2026, 11, 28)
DAY2 = date(2026, 11, 29)
MB = 1 << 20


def a_minute_ago() -> float:
    """An mtime past the settle period: the file is whole (tests not about settling use it)."""
    return time.time() - 60


@pytest.fixture
def paths(state_backend: StateBackend) -> StatePaths:
    paths = state_backend.paths
    paths.inbox_dir.mkdir(parents=True)
    return paths


@pytest.fixture
def landing(paths: StatePaths) -> Iterator[Landing]:
    with Landing(paths) as opened:
        yield opened


def put(path: Path, text: str = '{"prompt": "hi"}\n', *, mtime: float | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def assign_all(landing: Landing, paths: StatePaths, arrived: date) -> dict[str, tuple[str, str]]:
    return {
        a.name: (a.ds, a.source)
        for a in landing.assign_inbox(paths.inbox_dir, arrived=arrived, start=START)
    }


def test_a_new_file_never_renames_an_ingested_ones_source(
    landing: Landing, paths: StatePaths
) -> None:
    put(paths.inbox_dir / "seeds.jsonl")
    assert assign_all(landing, paths, DAY1) == {"seeds.jsonl": (DAY1.isoformat(), "seeds")}

    put(paths.inbox_dir / "seeds.csv", "prompt\nhi\n")  # same stem, same day
    assigned = assign_all(landing, paths, DAY1)

    assert assigned["seeds.jsonl"] == (DAY1.isoformat(), "seeds")  # unchanged
    assert assigned["seeds.csv"] == (DAY1.isoformat(), "seeds_csv")


def test_appending_on_a_later_day_is_a_new_version_not_a_second_partition(
    landing: Landing, paths: StatePaths
) -> None:
    path = put(paths.inbox_dir / "log.jsonl", mtime=a_minute_ago())
    (first,) = landing.assign_inbox(paths.inbox_dir, arrived=DAY1, start=START)
    v1 = landing.land(path, first, max_bytes=MB)

    with path.open("a") as handle:
        handle.write('{"prompt": "more"}\n')
    os.utime(path, (a_minute_ago(), a_minute_ago()))
    (again,) = landing.assign_inbox(paths.inbox_dir, arrived=DAY2, start=START)
    v2 = landing.land(path, again, max_bytes=MB)

    assert (again.ds, again.source) == (first.ds, first.source) == (DAY1.isoformat(), "log")
    assert v2.sha256 != v1.sha256
    assert landing.current(first.ds, first.source) == v2
    assert v1.path.read_text() == '{"prompt": "hi"}\n'  # the old snapshot is untouched


def test_a_file_copied_with_an_old_mtime_lands_on_the_day_it_arrived(
    landing: Landing, paths: StatePaths
) -> None:
    # `cp -p` / `rsync -a` keep a 2019 mtime: before the partitions, yet nothing may be dropped.
    put(paths.inbox_dir / "archive.jsonl", mtime=time.mktime((2019, 5, 1, 0, 0, 0, 0, 0, 0)))

    assert assign_all(landing, paths, DAY1) == {"archive.jsonl": (DAY1.isoformat(), "archive")}


def test_a_dated_folder_before_the_partitions_lands_on_their_first_day(
    landing: Landing, paths: StatePaths
) -> None:
    put(paths.inbox_dir / "2024-03-01" / "old.jsonl")
    put(paths.inbox_dir / "2025-06-01" / "fine.jsonl")

    (old, fine) = landing.assign_inbox(paths.inbox_dir, arrived=DAY1, start=START)

    assert (old.ds, old.clamped, old.dated_ds) == ("2025-01-01", True, "2024-03-01")
    assert (fine.ds, fine.clamped) == ("2025-06-01", False)


def test_the_same_name_in_two_places_on_one_day_gets_apart(
    landing: Landing, paths: StatePaths
) -> None:
    put(paths.inbox_dir / "seeds.jsonl")
    put(paths.inbox_dir / DAY1.isoformat() / "seeds.jsonl")
    put(paths.inbox_dir / DAY1.isoformat() / "Seeds!.jsonl")

    sources = {a.source for a in landing.assign_inbox(paths.inbox_dir, arrived=DAY1, start=START)}

    assert len(sources) == 3
    assert "seeds" in sources


def test_removing_or_rewriting_the_inbox_file_changes_nothing_landed(
    landing: Landing, paths: StatePaths
) -> None:
    path = put(paths.inbox_dir / "seeds.jsonl", '{"prompt": "original"}\n', mtime=a_minute_ago())
    ds, source = DAY1.isoformat(), "seeds"
    first = resolve_input(
        landing, paths.inbox_dir, ds, source, max_bytes=MB, arrived=DAY1, start=START
    )
    assert first.from_inbox
    assert first.version is not None
    assert first.version.path.parent == paths.landed_dir
    assert first.version.path.name == f"{first.version.sha256}.jsonl"

    path.unlink()
    gone = resolve_input(
        landing, paths.inbox_dir, ds, source, max_bytes=MB, arrived=DAY2, start=START
    )

    assert not gone.from_inbox
    assert gone.version is not None
    assert gone.version == first.version
    assert gone.version.path.read_text() == '{"prompt": "original"}\n'
    assert gone.problem is None


def test_a_file_over_the_limit_is_refused_before_it_is_read(
    landing: Landing, paths: StatePaths
) -> None:
    big = paths.inbox_dir / "huge.jsonl"
    with big.open("wb") as handle:
        handle.truncate(12 * (1 << 30))  # 12 GiB, sparse: reading it would take minutes
    (assignment,) = landing.assign_inbox(paths.inbox_dir, arrived=DAY1, start=START)

    started = time.monotonic()
    with pytest.raises(InputTooLargeError, match="over the 256 MiB limit"):
        landing.land(big, assignment, max_bytes=256 * MB)
    resolved = resolve_input(
        landing,
        paths.inbox_dir,
        assignment.ds,
        assignment.source,
        max_bytes=256 * MB,
        arrived=DAY1,
        start=START,
    )

    assert time.monotonic() - started < 30  # reading the 12 GiB would take minutes
    assert resolved.version is None
    assert resolved.problem is not None
    assert "KIMI_BATCH_MAX_INPUT_MB" in resolved.problem
    assert list(paths.landed_dir.glob("*.jsonl")) == []


def test_a_partition_nothing_ever_saw_is_a_clear_error(landing: Landing, paths: StatePaths) -> None:
    with pytest.raises(StorageError, match="no input file was ever seen"):
        resolve_input(
            landing, paths.inbox_dir, "2026-01-01", "nope", max_bytes=MB, arrived=DAY1, start=START
        )


def test_refused_entries_are_assigned_with_their_reason_and_never_landed(
    landing: Landing, paths: StatePaths, tmp_path: Path
) -> None:
    secret = put(tmp_path / "secret" / ".env", "TOKEN=abc\n")
    (paths.inbox_dir / "x.jsonl").symlink_to(secret)
    (assignment,) = landing.assign_inbox(paths.inbox_dir, arrived=DAY1, start=START)

    resolved = resolve_input(
        landing,
        paths.inbox_dir,
        assignment.ds,
        assignment.source,
        max_bytes=MB,
        arrived=DAY1,
        start=START,
    )

    assert assignment.refused is not None
    assert "outside the inbox" in assignment.refused
    assert resolved.version is None
    assert resolved.problem == assignment.refused
    assert not any(paths.landed_dir.glob("*.jsonl"))


def test_state_dirs_are_private(landing: Landing, paths: StatePaths) -> None:
    path = put(paths.inbox_dir / "seeds.jsonl", mtime=a_minute_ago())
    (assignment,) = landing.assign_inbox(paths.inbox_dir, arrived=DAY1, start=START)
    version = landing.land(path, assignment, max_bytes=MB)

    assert paths.landed_dir.stat().st_mode & 0o777 == 0o700
    assert version.path.stat().st_mode & 0o777 == 0o600
    if paths.database_url is None:
        assert paths.manifest_path.stat().st_mode & 0o777 == 0o600
    else:
        assert not paths.manifest_path.exists()  # the manifest is in PostgreSQL only
    assert len(scan_inbox(paths.inbox_dir)) == 1


# ---- an I/O error is not a content problem ----------------------------------------------------


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO, errno.EACCES])
def test_an_io_error_while_landing_fails_and_leaves_no_snapshot(
    landing: Landing, paths: StatePaths, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    put(paths.inbox_dir / "seeds.jsonl", '{"prompt": "one"}\n', mtime=a_minute_ago())
    ds, source = DAY1.isoformat(), "seeds"

    def failing_fsync(_fd: int) -> None:  # the disk fills (or fails) as the copy is flushed
        raise OSError(code, os.strerror(code))

    with monkeypatch.context() as patched:
        patched.setattr(os, "fsync", failing_fsync)
        with pytest.raises(LandingIOError, match=os.strerror(code)):
            resolve_input(
                landing, paths.inbox_dir, ds, source, max_bytes=MB, arrived=DAY1, start=START
            )
    assert landing.current(ds, source) is None
    assert sorted(p.name for p in paths.landed_dir.iterdir() if "manifest" not in p.name) == []

    # Once the machine is healthy again, the next try lands the whole file.
    healed = resolve_input(
        landing, paths.inbox_dir, ds, source, max_bytes=MB, arrived=DAY1, start=START
    )
    assert healed.from_inbox
    assert healed.problem is None
    assert healed.version is not None
    assert healed.version.path.read_text() == '{"prompt": "one"}\n'


# ---- a file still being written ---------------------------------------------------------------


class Writer:
    """Appends a row to a file every few milliseconds until stopped (a slow copy in progress)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rows = 0
        self._stop = threading.Event()
        self._writing = threading.Event()
        self._thread = threading.Thread(target=self._write, daemon=True)

    def _write(self) -> None:
        while not self._stop.is_set():
            with self.path.open("a") as handle:
                handle.write(json.dumps({"prompt": f"row {self.rows}"}) + "\n")
            self.rows += 1
            self._writing.set()
            self._stop.wait(0.02)

    def __enter__(self) -> Writer:
        # Once the first row is written, the file is being written: on a loaded machine the
        # thread might otherwise not have started when the test looks at the file.
        self._thread.start()
        assert self._writing.wait(10), "the writer thread never wrote"
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def test_a_file_still_being_written_is_never_landed_half(
    landing: Landing, paths: StatePaths
) -> None:
    path = paths.inbox_dir / "export.jsonl"
    path.write_text("")
    ds, source = DAY1.isoformat(), "export"
    args = {"max_bytes": MB, "arrived": DAY1, "start": START, "settle_s": 0.5}

    with Writer(path):
        with pytest.raises(InputNotSettledError, match="still changing"):
            resolve_input(landing, paths.inbox_dir, ds, source, **args)
        assert landing.current(ds, source) is None
    whole = resolve_input(landing, paths.inbox_dir, ds, source, **args)

    assert whole.version is not None
    assert whole.version.path.read_bytes() == path.read_bytes()

    # A new version being written: the run reads the last whole one and says why.
    with Writer(path):
        meanwhile = resolve_input(landing, paths.inbox_dir, ds, source, **args)
    assert meanwhile.version == whole.version
    assert not meanwhile.from_inbox
    assert meanwhile.problem is None
    assert meanwhile.deferred is not None
    assert "still changing" in meanwhile.deferred
    later = resolve_input(landing, paths.inbox_dir, ds, source, **args)
    assert later.version is not None
    assert later.version.sha256 != whole.version.sha256
    assert later.version.path.read_bytes() == path.read_bytes()


def test_a_file_written_just_now_lands_once_it_has_stood_still(
    landing: Landing, paths: StatePaths
) -> None:
    path = put(paths.inbox_dir / "fresh.jsonl")
    (assignment,) = landing.assign_inbox(paths.inbox_dir, arrived=DAY1, start=START)

    version = landing.land(path, assignment, max_bytes=MB, settle_s=0.5)

    assert version.path.read_text() == path.read_text()


# ---- FIFOs never block ------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_a_fifo_replacing_an_assigned_name_is_refused_without_blocking(
    landing: Landing, paths: StatePaths
) -> None:
    path = put(paths.inbox_dir / "seeds.jsonl", mtime=a_minute_ago())
    (assignment,) = landing.assign_inbox(paths.inbox_dir, arrived=DAY1, start=START)
    first = landing.land(path, assignment, max_bytes=MB)
    path.unlink()
    os.mkfifo(path)

    with pytest.raises(NotRegularFileError):
        landing.land(path, assignment, max_bytes=MB)
    resolved = resolve_input(
        landing,
        paths.inbox_dir,
        assignment.ds,
        assignment.source,
        max_bytes=MB,
        arrived=DAY1,
        start=START,
    )

    assert resolved.version == first  # the partition keeps its last landed version
    assert resolved.problem is not None
    assert "not a regular file" in resolved.problem


def test_the_version_a_partition_consumed_is_recorded_after_both_of_its_writes(
    landing: Landing,
) -> None:
    # Issue 42 item 4: seeds at a version do not say its input quarantine was written; the night
    # lands a version again until this record names it (`seeds_are_current`).
    assert landing.consumed("2026-11-28", "north") is None
    landing.record_consumed("2026-11-28", "north", "a" * 64)
    landing.record_consumed("2026-11-28", "north", "b" * 64)
    landing.record_consumed("2026-11-28", "south", "a" * 64)
    assert landing.consumed("2026-11-28", "north") == "b" * 64
    assert landing.consumed("2026-11-28", "south") == "a" * 64
