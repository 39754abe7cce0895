"""Landed inputs on real files and a real manifest: partitions fixed at first sight, snapshots."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from datetime import date
from pathlib import Path

import pytest

from kimi_batch.paths import StatePaths
from kimi_batch.storage.exceptions import StorageError
from kimi_batch.storage.inbox import scan_inbox
from kimi_batch.storage.landing import InputTooLargeError, Landing, resolve_input

START = date(2025, 1, 1)
DAY1 = date(2026, 11, 28)
DAY2 = date(2026, 11, 29)
MB = 1 << 20


@pytest.fixture
def paths(tmp_path: Path) -> StatePaths:
    paths = StatePaths(home=tmp_path / "home")
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
    path = put(paths.inbox_dir / "log.jsonl")
    (first,) = landing.assign_inbox(paths.inbox_dir, arrived=DAY1, start=START)
    v1 = landing.land(path, first, max_bytes=MB)

    with path.open("a") as handle:
        handle.write('{"prompt": "more"}\n')
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
    path = put(paths.inbox_dir / "seeds.jsonl", '{"prompt": "original"}\n')
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

    assert time.monotonic() - started < 5
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
    path = put(paths.inbox_dir / "seeds.jsonl")
    (assignment,) = landing.assign_inbox(paths.inbox_dir, arrived=DAY1, start=START)
    version = landing.land(path, assignment, max_bytes=MB)

    assert paths.landed_dir.stat().st_mode & 0o777 == 0o700
    assert version.path.stat().st_mode & 0o777 == 0o600
    assert paths.manifest_path.stat().st_mode & 0o777 == 0o600
    assert len(scan_inbox(paths.inbox_dir)) == 1
