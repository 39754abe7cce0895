"""The inbox scan on real files: what counts as an input, its (ds, source), hashing, resolving."""

from __future__ import annotations

import hashlib
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from kimi_batch.storage.inbox import (
    InboxFile,
    file_sha256,
    inbox_files_for_ds,
    is_ignored_name,
    resolve_source_file,
    sanitize_source,
    scan_inbox,
)

JUNE_1_NOON = datetime(2025, 6, 1, 12, 0, tzinfo=UTC).timestamp()


def write(path: Path, text: str = '{"prompt": "hi"}\n', *, mtime: float | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def by_name(inbox: Path) -> dict[str, InboxFile]:
    return {item.name: item for item in scan_inbox(inbox)}


def test_missing_inbox_is_empty(tmp_path: Path) -> None:
    assert scan_inbox(tmp_path / "nope") == []


def test_dated_folder_wins_over_mtime_and_root_files_use_mtime_utc(tmp_path: Path) -> None:
    write(tmp_path / "2025-06-03" / "questions.csv", "prompt\nhi\n", mtime=JUNE_1_NOON)
    write(tmp_path / "loose.jsonl", mtime=JUNE_1_NOON)

    files = by_name(tmp_path)

    assert files["2025-06-03/questions.csv"].ds == "2025-06-03"
    assert files["2025-06-03/questions.csv"].source == "questions"
    assert files["loose.jsonl"].ds == "2025-06-01"
    assert files["loose.jsonl"].path == tmp_path / "loose.jsonl"
    assert files["loose.jsonl"].size == len('{"prompt": "hi"}\n')
    assert files["loose.jsonl"].sha256 is None  # a scan only stats


def test_mtime_date_is_utc_not_local(tmp_path: Path) -> None:
    # 23:30 UTC on June 1 is already June 2 in UTC+2: the partition must not depend on the host.
    late = datetime(2025, 6, 1, 23, 30, tzinfo=UTC).timestamp()
    write(tmp_path / "late.jsonl", mtime=late)

    assert by_name(tmp_path)["late.jsonl"].ds == "2025-06-01"


@pytest.mark.parametrize(
    "name",
    [
        ".hidden.jsonl",
        "~lock.jsonl",
        "#autosave.jsonl#",
        "upload.jsonl.tmp",
        "upload.jsonl.part",
        "notes.txt",
        "README",
        "seeds.jsonl.crdownload",
    ],
)
def test_ignored_names(tmp_path: Path, name: str) -> None:
    write(tmp_path / name)

    assert is_ignored_name(name)
    assert scan_inbox(tmp_path) == []


def test_accepted_extensions_case_insensitive(tmp_path: Path) -> None:
    for name in ("a.jsonl", "b.NDJSON", "c.json", "d.parquet", "e.CSV"):
        write(tmp_path / name)

    assert [item.source for item in scan_inbox(tmp_path)] == ["a", "b", "c", "d", "e"]


def test_other_folders_and_directories_named_like_files_are_not_inputs(tmp_path: Path) -> None:
    write(tmp_path / "processed" / "old.jsonl")  # not a dated folder
    write(tmp_path / "2025-02-30" / "bad_date.jsonl")  # looks dated, is not a date
    (tmp_path / "folder.jsonl").mkdir()
    os.mkfifo(tmp_path / "pipe.jsonl")  # reading a fifo would block the sensor
    write(tmp_path / "real.jsonl")

    assert list(by_name(tmp_path)) == ["real.jsonl"]


def test_symlinked_upload_is_the_file_it_points_to(tmp_path: Path) -> None:
    target = write(tmp_path / "elsewhere" / "big.jsonl", mtime=JUNE_1_NOON)
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "big.jsonl").symlink_to(target)
    (inbox / "dangling.jsonl").symlink_to(tmp_path / "missing.jsonl")

    files = by_name(inbox)

    assert list(files) == ["big.jsonl"]
    assert files["big.jsonl"].ds == "2025-06-01"


@pytest.mark.parametrize(
    ("stem", "source"),
    [
        ("Seeds", "seeds"),
        ("My Seeds-v2 (final)", "my_seeds_v2_final"),
        ("__already_ok__", "already_ok"),
        ("x.y", "x_y"),
    ],
)
def test_sanitize_source(stem: str, source: str) -> None:
    assert sanitize_source(stem) == source


def test_sanitize_source_never_empty_and_bounded() -> None:
    unusable = sanitize_source("日本語")
    assert unusable.startswith("file_")
    assert unusable != sanitize_source("中文")
    long = sanitize_source("a" * 300)
    assert len(long) <= 90
    assert long != sanitize_source("a" * 301)


def test_same_stem_different_extension_on_one_day_gets_the_extension(tmp_path: Path) -> None:
    write(tmp_path / "2025-06-01" / "seeds.jsonl")
    write(tmp_path / "2025-06-01" / "seeds.csv", "prompt\nhi\n")
    write(tmp_path / "2025-06-02" / "seeds.jsonl")  # another day: no collision

    files = by_name(tmp_path)

    assert files["2025-06-01/seeds.jsonl"].source == "seeds_jsonl"
    assert files["2025-06-01/seeds.csv"].source == "seeds_csv"
    assert files["2025-06-02/seeds.jsonl"].source == "seeds"


def test_collisions_the_extension_cannot_split_get_a_path_hash(tmp_path: Path) -> None:
    # Same name in the root (mtime June 1) and in the June 1 folder: same ds, stem and extension.
    write(tmp_path / "seeds.jsonl", mtime=JUNE_1_NOON)
    write(tmp_path / "2025-06-01" / "seeds.jsonl")
    write(tmp_path / "2025-06-01" / "Seeds!.csv")

    sources = [item.source for item in inbox_files_for_ds(tmp_path, "2025-06-01")]

    assert len(set(sources)) == 3
    assert "seeds_csv" in sources
    assert all(source.startswith("seeds_jsonl_") for source in sources if source != "seeds_csv")


def test_scan_is_deterministic(tmp_path: Path) -> None:
    for index in range(20):
        write(tmp_path / f"2025-06-0{index % 3 + 1}" / f"file {index}.jsonl")
        write(tmp_path / f"2025-06-0{index % 3 + 1}" / f"file {index}.csv", "prompt\nx\n")

    assert scan_inbox(tmp_path) == scan_inbox(tmp_path)
    names = [item.name for item in scan_inbox(tmp_path)]
    assert names == sorted(names)


def test_file_sha256_and_lazy_hash(tmp_path: Path) -> None:
    payload = os.urandom(3 * 1024 * 1024 + 17)  # crosses the 1 MiB read chunks
    path = tmp_path / "blob.parquet"
    path.write_bytes(payload)

    expected = hashlib.sha256(payload).hexdigest()
    assert file_sha256(path) == expected
    (item,) = scan_inbox(tmp_path)
    hashed = item.hashed()
    assert hashed.sha256 == expected
    assert hashed.hashed() is hashed
    assert item.sha256 is None  # frozen: hashing returns a copy


def test_hash_of_unreadable_file_raises_oserror(tmp_path: Path) -> None:
    (tmp_path / "gone.jsonl").write_text("x")
    (item,) = scan_inbox(tmp_path)
    (tmp_path / "gone.jsonl").unlink()

    with pytest.raises(FileNotFoundError):
        item.hashed()


def test_resolve_source_file(tmp_path: Path) -> None:
    csv = write(tmp_path / "2025-06-01" / "seeds.csv", "prompt\nhi\n")
    jsonl = write(tmp_path / "2025-06-01" / "seeds.jsonl")
    loose = write(tmp_path / "Loose File.jsonl", mtime=JUNE_1_NOON)

    assert resolve_source_file(tmp_path, "2025-06-01", "seeds_csv") == csv
    assert resolve_source_file(tmp_path, "2025-06-01", "seeds_jsonl") == jsonl
    assert resolve_source_file(tmp_path, "2025-06-01", "loose_file") == loose


def test_resolve_keeps_the_extended_name_after_the_collision_is_gone(tmp_path: Path) -> None:
    jsonl = write(tmp_path / "2025-06-01" / "seeds.jsonl")
    csv = write(tmp_path / "2025-06-01" / "seeds.csv", "prompt\nhi\n")
    assert resolve_source_file(tmp_path, "2025-06-01", "seeds_jsonl") == jsonl

    csv.unlink()

    assert resolve_source_file(tmp_path, "2025-06-01", "seeds") == jsonl
    assert resolve_source_file(tmp_path, "2025-06-01", "seeds_jsonl") == jsonl


def test_resolve_missing_names_the_partition(tmp_path: Path) -> None:
    write(tmp_path / "2025-06-01" / "other.jsonl")

    with pytest.raises(FileNotFoundError) as caught:
        resolve_source_file(tmp_path, "2025-06-01", "seeds")

    message = str(caught.value)
    assert "date=2025-06-01" in message
    assert "source=seeds" in message
    assert "other" in message
