"""The inbox scan on real files: what counts as an input, what is refused unread, hashing."""

from __future__ import annotations

import hashlib
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from kimi_batch.inputs.inbox import (
    REFUSED_LINK,
    REFUSED_NAME,
    InboxFile,
    file_sha256,
    inspect_inbox_file,
    is_ignored_name,
    sanitize_source,
    scan_inbox,
)
from kimi_batch.storage import REFUSED_SPECIAL, NotRegularFileError

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


def test_dated_folder_gives_its_date_and_a_scan_only_stats(tmp_path: Path) -> None:
    write(tmp_path / "2025-06-03" / "questions.csv", "prompt\nhi\n", mtime=JUNE_1_NOON)
    write(tmp_path / "loose.jsonl", mtime=JUNE_1_NOON)

    files = by_name(tmp_path)

    assert files["2025-06-03/questions.csv"].dated_ds == "2025-06-03"
    assert files["loose.jsonl"].dated_ds is None  # dated on arrival by the landing manifest
    assert files["loose.jsonl"].path == tmp_path / "loose.jsonl"
    assert files["loose.jsonl"].size == len('{"prompt": "hi"}\n')
    assert files["loose.jsonl"].sha256 is None  # a scan only stats
    assert files["loose.jsonl"].refused is None


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

    assert [item.name for item in scan_inbox(tmp_path)] == [
        "a.jsonl",
        "b.NDJSON",
        "c.json",
        "d.parquet",
        "e.CSV",
    ]


def test_other_folders_and_directories_named_like_files_are_not_inputs(tmp_path: Path) -> None:
    write(tmp_path / "processed" / "old.jsonl")  # not a dated folder
    write(tmp_path / "2025-02-30" / "bad_date.jsonl")  # looks dated, is not a date
    (tmp_path / "folder.jsonl").mkdir()
    os.mkfifo(tmp_path / "pipe.jsonl")  # reading a fifo would block the sensor
    write(tmp_path / "real.jsonl")

    assert list(by_name(tmp_path)) == ["real.jsonl"]


def test_symlink_inside_the_inbox_is_the_file_it_points_to(tmp_path: Path) -> None:
    inbox = tmp_path / "inbox"
    target = write(inbox / "staging" / "big.jsonl")
    (inbox / "big.jsonl").symlink_to(target)
    (inbox / "dangling.jsonl").symlink_to(inbox / "missing.jsonl")

    files = by_name(inbox)

    assert list(files) == ["big.jsonl"]
    assert files["big.jsonl"].refused is None
    assert files["big.jsonl"].hashed().sha256 == file_sha256(target)


def test_symlink_out_of_the_inbox_is_refused_and_never_read(tmp_path: Path) -> None:
    secret = write(tmp_path / "home" / ".env", "API_KEY=hunter2\n")
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "x.jsonl").symlink_to(secret)
    outside_day = tmp_path / "elsewhere" / "2025-06-01"
    write(outside_day / "inner.jsonl")
    (inbox / "2025-06-02").symlink_to(outside_day)

    files = by_name(inbox)

    assert list(files) == ["x.jsonl"]  # the dated folder link is not even listed
    assert files["x.jsonl"].refused == REFUSED_LINK
    with pytest.raises(PermissionError):
        files["x.jsonl"].hashed()


def test_a_name_that_is_not_utf8_is_refused_under_a_safe_name(tmp_path: Path) -> None:
    os.makedirs(tmp_path, exist_ok=True)
    with open(os.path.join(os.fsencode(tmp_path), b"caf\xe9.jsonl"), "wb") as handle:
        handle.write(b'{"prompt": "hi"}\n')
    write(tmp_path / "good.jsonl")

    files = by_name(tmp_path)

    assert sorted(files) == ["caf\\xe9.jsonl", "good.jsonl"]
    refused = files["caf\\xe9.jsonl"]
    assert refused.refused == REFUSED_NAME
    refused.name.encode("utf-8")  # the safe name is valid UTF-8 (Parquet, tags, logs)
    assert files["good.jsonl"].refused is None
    assert inspect_inbox_file(tmp_path, "caf\\xe9.jsonl") is None  # not a real path


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


def test_inspect_one_file_by_name(tmp_path: Path) -> None:
    write(tmp_path / "2025-06-01" / "seeds.csv", "prompt\nhi\n")

    item = inspect_inbox_file(tmp_path, "2025-06-01/seeds.csv")

    assert item is not None
    assert item.dated_ds == "2025-06-01"
    assert item == by_name(tmp_path)["2025-06-01/seeds.csv"]
    assert inspect_inbox_file(tmp_path, "2025-06-01/missing.csv") is None


@pytest.mark.timeout(60)
def test_a_link_to_a_fifo_is_refused_and_hashing_a_fifo_never_blocks(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")  # no input extension: not a candidate by itself
    (tmp_path / "x.jsonl").symlink_to(tmp_path / "pipe")

    (item,) = scan_inbox(tmp_path)

    assert item.name == "x.jsonl"
    assert item.refused == REFUSED_SPECIAL
    with pytest.raises(NotRegularFileError):
        file_sha256(tmp_path / "x.jsonl")
    with pytest.raises(PermissionError):
        item.hashed()


# ---- a name swapped after the scan (time of check, time of use) --------------------------------


def test_a_link_swapped_in_after_the_scan_is_refused_at_open_with_the_reason(
    tmp_path: Path,
) -> None:
    secret = write(tmp_path / "home" / ".env", "API_KEY=hunter2\n")
    inbox = tmp_path / "inbox"
    path = write(inbox / "x.jsonl")
    (item,) = scan_inbox(inbox)  # a regular file when it was checked
    assert item.refused is None
    path.unlink()
    path.symlink_to(secret)  # in place by the time it is opened

    with pytest.raises(PermissionError, match=r"x\.jsonl: symlink resolves outside the inbox"):
        item.hashed()
    with pytest.raises(PermissionError, match="outside the inbox"):
        item.open()


def test_a_dated_folder_swapped_for_a_link_out_is_refused_at_open(tmp_path: Path) -> None:
    outside = write(tmp_path / "elsewhere" / "2025-06-01" / "seeds.jsonl", "TOKEN=abc\n")
    inbox = tmp_path / "inbox"
    write(inbox / "2025-06-01" / "seeds.jsonl")
    (item,) = scan_inbox(inbox)
    (inbox / "2025-06-01" / "seeds.jsonl").unlink()
    (inbox / "2025-06-01").rmdir()
    (inbox / "2025-06-01").symlink_to(outside.parent)

    with pytest.raises(PermissionError, match="outside the inbox"):
        item.hashed()


def test_a_fifo_swapped_in_after_the_scan_is_refused_without_blocking(tmp_path: Path) -> None:
    path = write(tmp_path / "x.jsonl")
    (item,) = scan_inbox(tmp_path)
    path.unlink()
    os.mkfifo(path)

    with pytest.raises(NotRegularFileError, match="not a regular file"):
        item.hashed()


def test_a_link_inside_the_inbox_is_read_through_its_real_path(tmp_path: Path) -> None:
    target = write(tmp_path / "2025-06-02" / "real.jsonl", '{"prompt": "real"}\n')
    (tmp_path / "2025-06-01").symlink_to(tmp_path / "2025-06-02")  # a dated folder link inside
    (tmp_path / "loose.jsonl").symlink_to(Path("2025-06-01") / "real.jsonl")  # relative, chained

    files = by_name(tmp_path)

    expected = file_sha256(target)
    assert files["loose.jsonl"].hashed().sha256 == expected
    assert files["2025-06-01/real.jsonl"].hashed().sha256 == expected
