"""Properties of the content-addressed blob store (`kimi_batch.storage.blobs`) and of owner-only
file writes (`kimi_batch.storage.private_files`), server-free.

Blobs shared by hosts are the PostgreSQL case; here the same `BlobStore` code runs on a SQLite
file that two "hosts" (two connections, two cache folders) share, told by its `StateLocation`
that the state is shared (the location's URL is never connected to: only `embedded` is read).
Parts are a few bytes (`PART_BYTES` patched, as test_blobs does), and one test crosses the real
1 MiB part at its edge.

- Any bytes (empty, one part exactly, a part plus or minus a byte, several parts) shared on one
  host are fetched whole on the other, owner-only, with no temp file left; the row says its size
  and part count.
- The same blob shared twice, or by two threads at once, is one row and one set of parts.
- A blob whose parts do not hash to its name (changed, missing, cut short) is refused and no
  file is left in the cache; bytes that do not hash to the name are refused at share, leaving
  nothing that would keep the right bytes out; a name that is not `<sha256>` or `<sha256>.<ext>` (`../x`, `/abs`,
  a NUL) is refused before any file or row is touched.
- `write_private_text` writes any text exactly, 0600, or (text UTF-8 cannot hold) fails leaving
  the old file as it was; either way no temp is left.
- `remove_stale_temps` removes exactly the temps of writers that are gone: never a live
  writer's, never a name it did not make, never a folder.
- `private_folder_swap` puts the new folder in place whole, or, stopped anywhere inside the
  block or between its renames, leaves the old folder as it was; nothing hidden is left.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kimi_batch.storage.blobs as blobs_module
from kimi_batch.crash_points import CrashPointReached, armed
from kimi_batch.paths import StateLocation
from kimi_batch.state import connect_state
from kimi_batch.storage import (
    BlobStore,
    StorageError,
    private_folder_swap,
    remove_stale_temps,
    temp_name,
    write_private_text,
)

EXAMPLES = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PART = 16


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@contextmanager
def two_hosts(part_bytes: int = PART) -> Iterator[tuple[BlobStore, BlobStore]]:
    """One store's blobs on two hosts sharing a SQLite state file, in `part_bytes` parts."""
    with (
        tempfile.TemporaryDirectory() as tmp,
        mock.patch.object(blobs_module, "PART_BYTES", part_bytes),
    ):
        file = Path(tmp) / "state" / "api.sqlite3"
        embedded = StateLocation(path=file, schema_name="kimi_api")
        shared = embedded.model_copy(update={"url": "postgresql://never-connected/"})
        stores: list[BlobStore] = []
        for host in ("here", "there"):
            folder = Path(tmp) / host
            folder.mkdir()
            stores.append(BlobStore(connect_state(embedded), folder, shared))
        try:
            yield stores[0], stores[1]
        finally:
            for store in stores:
                store._db.close()


def keep(store: BlobStore, data: bytes, ext: str | None = "jsonl") -> str:
    """`data` as a blob file of `store`'s host; its name."""
    name = sha(data) + (f".{ext}" if ext else "")
    store.path(name).write_bytes(data)
    return name


def rows(store: BlobStore, name: str) -> tuple[tuple[int, int] | None, int]:
    row = store._db.execute("SELECT size, parts FROM blobs WHERE name = ?", (name,)).fetchone()
    (parts,) = store._db.execute(
        "SELECT COUNT(*) FROM blob_parts WHERE name = ?", (name,)
    ).fetchone()
    return (None if row is None else (int(row[0]), int(row[1]))), int(parts)


def hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


# Sizes at the part's edges, and any size up to a few parts.
SIZES = st.one_of(
    st.sampled_from([0, 1, PART - 1, PART, PART + 1, 2 * PART, 3 * PART + 1]),
    st.integers(0, 6 * PART),
)


@EXAMPLES
@given(size=SIZES, seed=st.binary(min_size=1, max_size=8), ext=st.sampled_from([None, "jsonl"]))
def test_a_blob_shared_on_one_host_is_fetched_whole_on_the_other(
    size: int, seed: bytes, ext: str | None
) -> None:
    data = (seed * (size // len(seed) + 1))[:size]
    with two_hosts() as (here, there):
        name = keep(here, data, ext)
        here.share(name)
        assert here.has(name)
        assert there.has(name)
        assert rows(there, name) == ((size, -(-size // PART)), -(-size // PART))
        path = there.local(name)
        assert path == there.folder / name
        assert path.read_bytes() == data
        assert path.stat().st_mode & 0o777 == 0o600
        assert hidden(there.folder) == []
        assert there.local(name) == path  # cached: served from the file


@pytest.mark.parametrize("size", [(1 << 20) - 1, 1 << 20, (1 << 20) + 1])
def test_a_blob_at_the_edge_of_a_real_part_arrives_whole(size: int) -> None:
    data = os.urandom(size)
    with two_hosts(blobs_module.PART_BYTES) as (here, there):
        name = keep(here, data)
        here.share(name)
        assert rows(there, name) == ((size, -(-size // (1 << 20))), -(-size // (1 << 20)))
        assert there.local(name).read_bytes() == data


@EXAMPLES
@given(data=st.binary(max_size=5 * PART), threads=st.integers(1, 2))
def test_the_same_blob_shared_again_or_at_once_is_one_blob(data: bytes, threads: int) -> None:
    with two_hosts() as (here, there):
        name = keep(here, data)
        keep(there, data)
        if threads == 1:
            here.share(name)  # shared before, then again by each host
        errors: list[BaseException] = []

        def share_from(store: BlobStore) -> None:
            try:
                store.share(name)
            except BaseException as error:  # reported to the test below
                errors.append(error)

        # The hosts at once, each on its own connection (a second row or part would be a
        # primary key violation).
        workers = [
            threading.Thread(target=share_from, args=(store,)) for store in [here, there][:threads]
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        assert errors == []
        assert rows(here, name) == ((len(data), -(-len(data) // PART)), -(-len(data) // PART))
        (there.folder / name).unlink()
        assert there.local(name).read_bytes() == data


@EXAMPLES
@given(
    data=st.binary(min_size=1, max_size=4 * PART),
    damage=st.sampled_from(["changed", "missing_part", "size", "parts"]),
)
def test_a_blob_whose_parts_do_not_match_its_name_is_never_served(data: bytes, damage: str) -> None:
    with two_hosts() as (here, there):
        name = keep(here, data)
        here.share(name)
        db = here._db
        if damage == "changed":
            db.execute(
                "UPDATE blob_parts SET data = ? WHERE name = ? AND part = 0",
                (bytes(b ^ 1 for b in data[:PART]), name),
            )
        elif damage == "missing_part":
            db.execute("DELETE FROM blob_parts WHERE name = ? AND part = 0", (name,))
        elif damage == "size":
            db.execute("UPDATE blobs SET size = size + 1 WHERE name = ?", (name,))
        else:  # a row that counts a part fewer: the blob cut short
            db.execute("UPDATE blobs SET parts = parts - 1 WHERE name = ?", (name,))
        with pytest.raises(StorageError, match=r"missing|do not match"):
            there.local(name)
        assert list(there.folder.iterdir()) == []


@EXAMPLES
@given(data=st.binary(max_size=40))
def test_bytes_under_another_hash_are_refused_at_share_and_the_right_ones_shared_later(
    data: bytes,
) -> None:
    """Shared, they were refused by every host's fetch, and the right bytes shared later found
    the name taken: the blob was lost for good."""
    with two_hosts() as (here, there):
        right = data + b"!"
        name = sha(right) + ".jsonl"
        here.path(name).write_bytes(data)
        with pytest.raises(StorageError, match="do not match"):
            here.share(name)
        assert not here.has(name)
        assert here._db.execute("SELECT count(*) FROM blob_parts").fetchone() == (0,)
        with pytest.raises(StorageError, match="neither"):
            there.local(name)
        here.path(name).write_bytes(right)
        here.share(name)
        assert there.local(name).read_bytes() == right


NOT_BLOB_NAMES = st.one_of(
    st.sampled_from(
        [
            "../secret",
            "/etc/hostname",
            "a\x00b",
            "",
            ".",
            "..",
            f"../{'0' * 64}",
            f"{'0' * 64}/../../secret",
            f"{'0' * 64}.jsonl/..",
            f"{'0' * 64}\x00.jsonl",
            f"{'A' * 64}",
            f"{'0' * 63}",
            f"{'0' * 64}.",
        ]
    ),
    st.text(max_size=80).filter(
        lambda text: len(text.split(".")[0]) != 64 or "/" in text or "\x00" in text
    ),
)


@EXAMPLES
@given(name=NOT_BLOB_NAMES, shared=st.booleans())
def test_a_name_that_is_not_a_hash_is_refused(name: str, shared: bool) -> None:
    with two_hosts() as (here, there):
        (here.folder.parent / "secret").write_text("not a blob")
        store = (
            here
            if shared
            else BlobStore(
                here._db, here.folder, StateLocation(path=Path("/unused"), schema_name="kimi_api")
            )
        )
        for call in (store.path, store.local, store.share):
            with pytest.raises(StorageError, match="not a blob name"):
                call(name)
        assert rows(there, name) == (None, 0)
        assert sorted(p.name for p in here.folder.parent.iterdir()) == [
            "here",
            "secret",
            "state",
            "there",
        ]
        assert list(here.folder.iterdir()) == []


# ---- owner-only files ---------------------------------------------------------------------------


@EXAMPLES
@given(old=st.text(max_size=50), new=st.text(max_size=200))
def test_a_private_file_holds_exactly_what_was_written_or_what_it_held(old: str, new: str) -> None:
    old = old.encode("utf-8", "replace").decode("utf-8")  # the old one was written
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "out" / "file.txt"
        write_private_text(path, old)
        try:
            new.encode("utf-8")
        except UnicodeEncodeError:
            with pytest.raises(UnicodeEncodeError):
                write_private_text(path, new)
            expected = old
        else:
            write_private_text(path, new)
            expected = new
        assert path.read_bytes().decode("utf-8") == expected
        assert path.stat().st_mode & 0o777 == 0o600
        assert path.parent.stat().st_mode & 0o777 == 0o700
        assert os.listdir(path.parent) == ["file.txt"]


class WriterStoppedError(Exception):
    """The writer filling a swapped folder stopped (an error, a kill) before its end."""


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


@EXAMPLES
@given(
    entries=st.lists(
        st.tuples(
            st.sampled_from(["dead", "alive", "mine", "user"]),
            st.sampled_from(["x", "file.jsonl", "snap shot", ".hidden"]),
            st.sampled_from([".tmp", ".chunk", ".1.chunk", ".bak"]),
            st.booleans(),  # a folder of that name
        ),
        max_size=8,
    )
)
def test_only_the_temps_of_writers_that_are_gone_are_removed(
    entries: list[tuple[str, str, str, bool]],
) -> None:
    dead = _dead_pid()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        expected_removed: set[str] = set()
        for index, (writer, name, suffix, is_folder) in enumerate(entries):
            pid = {"dead": dead, "alive": 1, "mine": os.getpid(), "user": 0}[writer]
            entry = (
                folder / f"{name}.{index}{suffix}"  # the user's own name: never ours
                if writer == "user"
                else folder / f".{name}.{pid}-{index:032x}{suffix}"
            )
            if is_folder:
                entry.mkdir()
            else:
                entry.write_text("partial")
            if writer == "dead" and suffix != ".bak" and not is_folder:
                expected_removed.add(entry.name)
        before = {p.name for p in folder.iterdir()}
        removed = {p.name for p in remove_stale_temps(folder)}
        assert removed == expected_removed
        assert {p.name for p in folder.iterdir()} == before - expected_removed
        assert remove_stale_temps(folder) == []
        # A temp this process names now is its own: never removed while it runs.
        mine = temp_name(folder, "next")
        mine.write_text("writing")
        assert remove_stale_temps(folder) == []
        assert mine.exists()


@EXAMPLES
@given(
    old=st.dictionaries(st.sampled_from(["a", "b", "c.txt"]), st.binary(max_size=20), max_size=3),
    new=st.dictionaries(st.sampled_from(["a", "d", "e.txt"]), st.binary(max_size=20), max_size=3),
    stop=st.sampled_from([None, "inside", "export.folder_set_aside"]),
)
def test_a_folder_swap_is_whole_or_leaves_the_old_folder(
    old: dict[str, bytes], new: dict[str, bytes], stop: str | None
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "export"
        path.mkdir()
        for name, data in old.items():
            (path / name).write_bytes(data)

        with (
            armed("export.folder_set_aside") if stop == "export.folder_set_aside" else nullcontext()
        ):
            try:
                with private_folder_swap(path) as filling:
                    assert filling.stat().st_mode & 0o777 == 0o700
                    for name, data in new.items():
                        (filling / name).write_bytes(data)
                    if stop == "inside":
                        raise WriterStoppedError
            except (WriterStoppedError, CrashPointReached):
                pass
        expected = old if stop else new
        assert {p.name: p.read_bytes() for p in path.iterdir()} == expected
        assert hidden(Path(tmp)) == []


# ---- regression tests -------------------------------------------------------------------------


def test_a_blob_name_that_leads_out_of_the_store_is_refused(tmp_path: Path) -> None:
    """Found by `test_a_name_that_is_not_a_hash_is_refused`: `local('../secret')` and
    `local('/etc/hostname')` returned those files, outside the store's folder, as the blob's (and
    `share` would have put them into the database); a name is now `<sha256>[.<ext>]` or refused."""
    folder = tmp_path / "files"
    folder.mkdir()
    (tmp_path / "secret").write_text("not a blob")
    location = StateLocation(path=tmp_path / "api.sqlite3", schema_name="kimi_api")
    with connect_state(location) as db:
        store = BlobStore(db, folder, location)
        for name in ("../secret", "/etc/hostname", f"{'0' * 64}/../../secret"):
            with pytest.raises(StorageError, match="not a blob name"):
                store.local(name)
            with pytest.raises(StorageError, match="not a blob name"):
                store.share(name)
        name = sha(b"fine") + ".jsonl"
        assert store.local(name) == folder / name
