"""Properties of landing (`kimi_batch.inputs.landing`): inbox files snapshotted whole into a
content-addressed folder and recorded in the manifest, a name's partition fixed at first sight.

A state machine works on a real inbox folder and a real manifest (SQLite in a temp dir): files
are written, appended, written in several steps, reverted to an earlier content, renamed,
deleted and touched without a change; a landing is tried at any point, also one stopped by an
exception at a crash point (`landing.snapshot_copied`, `landing.version_recorded`), one whose
file is rewritten while it is being copied, and the Landing is closed and opened again (a new
process). Files carry an mtime an hour old, so nothing waits for a file to settle.

What must hold after every step:
- a name's (ds, source) never changes once assigned, and two names never share a partition;
- the manifest's versions of a partition are exactly the contents landed, in order, a content
  equal to the newest one adding nothing (A, B, A is three versions; A, A is one);
- `current` is the last landed version, and `earlier_landings` counts its earlier landings;
- every recorded version's snapshot is there, its bytes hash to its name and are a content the
  file really had (never a mix of two writes); `readable` gives that file;
- nothing but snapshots and the manifest is left in the landed folder (no temp file).
A landing stopped at a crash point leaves no version pointing at a missing or partial snapshot,
and the next landing of the same content completes it. Several processes landing the same
content at once add one version; a file whose metadata alone moves while it is copied (a chmod,
a link, a rename: its ctime moves) lands whole. `still_changing` says a file is settled exactly
when its mtime is at least the settle time old, and a snapshot is one file named by its hash, also
when copied twice.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import threading
import time
from datetime import date
from pathlib import Path
from typing import BinaryIO

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
)

from kimi_batch.crash_points import CrashPointReached, armed
from kimi_batch.inputs.landing import (
    SETTLE_S,
    Assignment,
    InputNotSettledError,
    Landing,
    copy_snapshot,
    still_changing,
)
from kimi_batch.paths import StatePaths
from kimi_batch.state import connect_state

DAY = date(2026, 11, 28)
MAX_BYTES = 1 << 16
# Two names of one stem (their sources are told apart by the extension), and others.
NAMES = ("a.jsonl", "a.csv", "b.jsonl", "c.json")
CONTENTS = st.one_of(
    st.sampled_from([b"", b'{"prompt": "one"}\n', b'{"prompt": "two"}\n', b"x" * 300]),
    st.binary(max_size=200),
)
CRASH_POINTS = ("landing.snapshot_copied", "landing.version_recorded")


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_settled(path: Path, data: bytes, *, age_s: float = 3600.0) -> None:
    """Write `data` as a whole file whose mtime is `age_s` in the past (settled)."""
    path.write_bytes(data)
    past_ns = time.time_ns() - int(age_s * 1e9)
    os.utime(path, ns=(past_ns, past_ns))


class _ChangedMidCopy:
    """The open inbox file, read a few bytes at a time; after the first read `change` runs
    (what another process does to the file while it is copied)."""

    def __init__(self, reader: BinaryIO) -> None:
        self._reader = reader
        self._reads = 0

    def change(self) -> None:
        raise NotImplementedError

    def fileno(self) -> int:
        return self._reader.fileno()

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._reader.seek(offset, whence)

    def read(self, size: int = -1) -> bytes:
        self._reads += 1
        if self._reads == 2:
            self.change()
        return os.read(self._reader.fileno(), 7)


class RewrittenMidCopy(_ChangedMidCopy):
    """Another writer rewrites the file in place to `then` (an editor saving, a sync tool) and,
    when `keep_mtime`, puts its mtime back as such tools do (`rsync --inplace -a`, `cp -p`)."""

    def __init__(self, reader: BinaryIO, path: Path, then: bytes, *, keep_mtime: bool) -> None:
        super().__init__(reader)
        self._path, self._then, self._keep_mtime = path, then, keep_mtime
        self.rewritten = False

    def change(self) -> None:
        self.rewrite()

    def rewrite(self) -> None:
        """Rewrite the file (once): mtime put back, or set to another time long past."""
        if self.rewritten:
            return
        self.rewritten = True
        before = os.stat(self._path)
        with self._path.open("r+b") as writer:
            writer.write(self._then)
            writer.truncate()
        mtime_ns = before.st_mtime_ns if self._keep_mtime else before.st_mtime_ns - 10**9
        os.utime(self._path, ns=(before.st_atime_ns, mtime_ns))


METADATA_CHANGES = ("chmod", "link", "rename")


class MetadataMovedMidCopy(_ChangedMidCopy):
    """Something moves the file's metadata and not its bytes (a backup agent's chmod, a hard
    link, a rename there and back): its ctime moves, its size and mtime do not."""

    def __init__(self, reader: BinaryIO, path: Path, change: str) -> None:
        super().__init__(reader)
        self._path, self._change = path, change
        self.ctime_moved = False

    def change(self) -> None:
        self.move_metadata()

    def move_metadata(self) -> None:
        """Change the metadata until the ctime has moved (its clock ticks coarsely)."""
        before = os.stat(self._path)
        for attempt in range(1000):
            if self._change == "chmod":
                os.chmod(self._path, 0o640 if attempt % 2 == 0 else 0o600)
            elif self._change == "link":
                os.link(self._path, self._path.with_name(f"{self._path.name}.link{attempt}"))
            else:
                moved = self._path.with_name(f"{self._path.name}.moved")
                os.rename(self._path, moved)
                os.rename(moved, self._path)
            after = os.stat(self._path)
            if after.st_ctime_ns != before.st_ctime_ns:
                assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
                self.ctime_moved = True
                return
            time.sleep(0.002)


class LandingMachine(RuleBasedStateMachine):
    """An inbox, its landing, and what the model says every name had and landed."""

    landed_names = Bundle("landed_names")

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="landing-props-"))
        self.paths = StatePaths(home=self.tmp / "home")
        self.inbox = self.paths.inbox_dir
        self.inbox.mkdir(parents=True)
        self.landing = Landing(self.paths)
        self.files: dict[str, bytes] = {}  # the inbox now
        self.had: dict[str, list[bytes]] = {}  # every whole content a name ever had
        self.assigned: dict[str, Assignment] = {}
        self.versions: dict[str, list[str]] = {}  # name -> sha256 of each version, oldest first

    def teardown(self) -> None:
        self.landing.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    # ---- the inbox ----------------------------------------------------------------------------

    def _put(self, name: str, data: bytes) -> None:
        write_settled(self.inbox / name, data)
        self.files[name] = data
        self.had.setdefault(name, []).append(data)

    @rule(name=st.sampled_from(NAMES), data=CONTENTS)
    def write(self, name: str, data: bytes) -> None:
        self._put(name, data)

    @precondition(lambda self: self.files)
    @rule(data=st.data(), extra=st.binary(min_size=1, max_size=50))
    def append(self, data: st.DataObject, extra: bytes) -> None:
        name = data.draw(st.sampled_from(sorted(self.files)))
        self._put(name, self.files[name] + extra)

    @rule(name=st.sampled_from(NAMES), data=CONTENTS, cut=st.integers(0, 200))
    def write_in_steps(self, name: str, data: bytes, cut: int) -> None:
        """The first part, a landing tried while the writer pauses (the file had that part),
        then the whole."""
        self._put(name, data[:cut])
        self._land(name)
        self._put(name, data)

    @precondition(lambda self: any(len(set(had)) > 1 for had in self.had.values()))
    @rule(data=st.data())
    def revert(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(n for n, h in self.had.items() if len(set(h)) > 1)))
        self._put(name, data.draw(st.sampled_from(self.had[name])))

    @precondition(lambda self: self.files)
    @rule(data=st.data(), target_name=st.sampled_from(NAMES))
    def rename(self, data: st.DataObject, target_name: str) -> None:
        name = data.draw(st.sampled_from(sorted(self.files)))
        os.replace(self.inbox / name, self.inbox / target_name)
        moved = self.files.pop(name)
        self.files[target_name] = moved
        self.had.setdefault(target_name, []).append(moved)

    @precondition(lambda self: self.files)
    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.files)))
        (self.inbox / name).unlink()
        del self.files[name]

    @precondition(lambda self: self.files)
    @rule(data=st.data(), age_s=st.floats(60, 10**6))
    def touch(self, data: st.DataObject, age_s: float) -> None:
        name = data.draw(st.sampled_from(sorted(self.files)))
        past_ns = time.time_ns() - int(age_s * 1e9)
        os.utime(self.inbox / name, ns=(past_ns, past_ns))

    @rule()
    def reopen(self) -> None:
        """A new process: the manifest and the snapshots are all it knows."""
        self.landing.close()
        self.landing = Landing(self.paths)

    # ---- landing ------------------------------------------------------------------------------

    def _assign(self, name: str) -> Assignment:
        assignment = self.landing.assign(name, arrived=DAY, start=DAY)
        first = self.assigned.setdefault(name, assignment)
        assert (assignment.ds, assignment.source) == (first.ds, first.source)
        return assignment

    def _expect_landed(self, name: str, data: bytes) -> None:
        """The model's record of landing `data` under `name`: new unless it is the newest."""
        versions = self.versions.setdefault(name, [])
        if not versions or versions[-1] != sha(data):
            versions.append(sha(data))

    def _land(self, name: str) -> None:
        assignment = self._assign(name)
        version = self.landing.land(self.inbox / name, assignment, max_bytes=MAX_BYTES)
        data = self.files[name]
        self._expect_landed(name, data)
        assert version.sha256 == sha(data)
        assert (version.ds, version.source, version.size) == (
            assignment.ds,
            assignment.source,
            len(data),
        )
        assert version.path.read_bytes() == data

    @precondition(lambda self: self.files)
    @rule(target=landed_names, data=st.data())
    def land(self, data: st.DataObject) -> str:
        name = data.draw(st.sampled_from(sorted(self.files)))
        self._land(name)
        return name

    @rule(name=consumes(landed_names))
    def land_a_name_gone_from_the_inbox(self, name: str) -> None:
        """A name landed before and since removed or renamed: nothing changes."""
        if name in self.files:
            return
        with pytest.raises(FileNotFoundError):
            self.landing.land(self.inbox / name, self._assign(name), max_bytes=MAX_BYTES)

    @precondition(lambda self: self.files)
    @rule(data=st.data(), point=st.sampled_from(CRASH_POINTS))
    def land_stopped_at_a_crash_point(self, data: st.DataObject, point: str) -> None:
        name = data.draw(st.sampled_from(sorted(self.files)))
        assignment = self._assign(name)
        content = self.files[name]
        with armed(point):
            try:
                self.landing.land(self.inbox / name, assignment, max_bytes=MAX_BYTES)
            except CrashPointReached:
                if point == "landing.version_recorded":
                    self._expect_landed(name, content)  # the version was written, then it stopped
                return
        self._expect_landed(name, content)  # the point was not on this landing's path

    @precondition(lambda self: self.files)
    @rule(data=st.data(), keep_mtime=st.booleans())
    def land_while_rewritten(self, data: st.DataObject, keep_mtime: bool) -> None:
        """The file is rewritten while it is copied (often to as many bytes): the landing is
        refused (nothing new is recorded), or it lands one whole content the file had; never
        a mix of the two."""
        name = data.draw(st.sampled_from(sorted(self.files)))
        assignment = self._assign(name)
        path = self.inbox / name
        before = self.files[name]
        same_size = st.binary(min_size=len(before), max_size=len(before))
        then = data.draw(st.one_of(same_size, CONTENTS))
        with path.open("rb") as reader:
            handle = RewrittenMidCopy(reader, path, then, keep_mtime=keep_mtime)
            try:
                version = self.landing.land(
                    path,
                    assignment,
                    max_bytes=MAX_BYTES,
                    handle=handle,  # type: ignore[arg-type]
                )
            except InputNotSettledError:
                version = None
        handle.rewrite()  # an empty file is copied at its first read: rewritten after
        self.files[name] = then
        self.had[name].append(then)
        if version is not None:
            landed = version.path.read_bytes()
            assert landed in (before, then), "a mix of two writes was landed"
            self._expect_landed(name, landed)

    # ---- what must hold -----------------------------------------------------------------------

    @invariant()
    def partitions_stay_where_first_seen(self) -> None:
        for name, first in self.assigned.items():
            now = self.landing.assignment(name)
            assert now is not None
            assert (now.ds, now.source, now.first_seen) == (
                first.ds,
                first.source,
                first.first_seen,
            )
        keys = [(a.ds, a.source) for a in self.assigned.values()]
        assert len(keys) == len(set(keys))

    @invariant()
    def versions_are_the_contents_landed_in_order(self) -> None:
        with connect_state(self.paths.manifest_state) as db:
            for name, assignment in self.assigned.items():
                rows = db.execute(
                    "SELECT sha256, name FROM versions WHERE ds = ? AND source = ? ORDER BY id",
                    (assignment.ds, assignment.source),
                ).fetchall()
                assert [row[0] for row in rows] == self.versions.get(name, [])
                assert {row[1] for row in rows} <= {name}

    @invariant()
    def current_is_the_last_landed_version(self) -> None:
        for name, assignment in self.assigned.items():
            current = self.landing.current(assignment.ds, assignment.source)
            expected = self.versions.get(name, [])
            if not expected:
                assert current is None
                continue
            assert current is not None
            assert current.sha256 == expected[-1]
            assert self.landing.earlier_landings(
                assignment.ds, assignment.source, current.sha256
            ) == (expected.count(current.sha256) - 1)

    @invariant()
    def every_version_is_a_whole_content_the_file_had(self) -> None:
        for name, assignment in self.assigned.items():
            for digest in set(self.versions.get(name, [])):
                version = self.landing.version(assignment.ds, assignment.source, digest)
                assert version is not None
                assert self.landing.readable(version) == version
                data = version.path.read_bytes()
                assert sha(data) == digest == version.path.name.split(".")[0]
                assert data in self.had[name]
                assert version.size == len(data)
                assert version.path.stat().st_mode & 0o777 == 0o600

    @invariant()
    def no_temp_file_is_left(self) -> None:
        if not self.paths.landed_dir.exists():
            return
        for entry in self.paths.landed_dir.iterdir():
            assert entry.name.startswith("manifest.sqlite3") or (
                len(entry.name.split(".")[0]) == 64 and not entry.name.startswith(".")
            ), entry.name


LandingMachine.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestLanding = LandingMachine.TestCase


# ---- the settle rule and the copy -----------------------------------------------------------

EXAMPLES = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@EXAMPLES
@given(
    size=st.integers(0, 1 << 40),
    mtime_ns=st.integers(0, 1 << 62),
    now_ns=st.integers(0, 1 << 62),
    settle_s=st.floats(0, 3600, allow_nan=False),
)
def test_a_file_is_still_changing_exactly_while_its_mtime_is_recent_or_ahead(
    size: int, mtime_ns: int, now_ns: int, settle_s: float
) -> None:
    age_s = (now_ns - mtime_ns) / 1e9
    assert still_changing((size, mtime_ns), now_ns, settle_s) == (age_s < 0 or age_s < settle_s)
    # Later looks never see a settled file as changing again (time moves one way).
    if not still_changing((size, mtime_ns), now_ns, settle_s):
        assert not still_changing((size, mtime_ns), now_ns + 10**9, settle_s)
    assert still_changing((size, now_ns + 1), now_ns, SETTLE_S)  # dated in the future


@EXAMPLES
@given(data=st.binary(max_size=3000), ext=st.sampled_from(["jsonl", "csv", "bin"]))
def test_a_snapshot_is_the_file_named_by_its_hash_and_nothing_else_is_left(
    data: bytes, ext: str
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        source, landed = Path(tmp) / "in", Path(tmp) / "landed"
        landed.mkdir()
        write_settled(source, data)
        for _ in range(2):  # the same content copied twice is one file
            with source.open("rb") as reader:
                snapshot = copy_snapshot(reader, landed, name="in", max_bytes=3000, ext=ext)
            assert (snapshot.sha256, snapshot.ext, snapshot.size) == (sha(data), ext, len(data))
            assert [p.name for p in landed.iterdir()] == [f"{sha(data)}.{ext}"]
            assert (landed / f"{sha(data)}.{ext}").read_bytes() == data


# ---- regression tests -------------------------------------------------------------------------


def test_a_damaged_snapshot_is_replaced_by_the_next_copy_of_its_bytes(tmp_path: Path) -> None:
    """A snapshot of the same name was kept as it was: one damaged after it landed (a disk
    error, a hand edit) was read by every later run, and a new copy of the right bytes was
    thrown away."""
    source, landed = tmp_path / "in", tmp_path / "landed"
    landed.mkdir()
    write_settled(source, b'{"prompt": "hi"}\n')
    target = landed / f"{sha(source.read_bytes())}.jsonl"
    target.write_bytes(b'{"prompt": "h')
    with source.open("rb") as reader:
        copy_snapshot(reader, landed, name="in", max_bytes=3000, ext="jsonl")
    assert target.read_bytes() == source.read_bytes()
    assert [path.name for path in landed.iterdir()] == [target.name]


def test_a_file_rewritten_in_place_while_copied_is_not_landed_even_with_its_mtime_put_back(
    tmp_path: Path,
) -> None:
    """Found by `land_while_rewritten`: a writer that rewrote the file in place during the copy
    and put its mtime back (same size) left (size, mtime) as they were, and the first bytes of
    one write were landed with the rest of the other's."""
    paths = StatePaths(home=tmp_path / "home")
    paths.inbox_dir.mkdir(parents=True)
    path = paths.inbox_dir / "seeds.jsonl"
    write_settled(path, b"A" * 40)
    with Landing(paths) as landing, path.open("rb") as reader:
        assignment = landing.assign("seeds.jsonl", arrived=DAY, start=DAY)
        handle = RewrittenMidCopy(reader, path, b"B" * 40, keep_mtime=True)
        with pytest.raises(InputNotSettledError, match="still changing"):
            landing.land(path, assignment, max_bytes=MAX_BYTES, handle=handle)  # type: ignore[arg-type]
        assert landing.current(assignment.ds, assignment.source) is None
        assert sorted(p.name for p in paths.landed_dir.iterdir() if "manifest" not in p.name) == []
        # Once the writer is done, the whole new content lands.
        assert landing.land(path, assignment, max_bytes=MAX_BYTES).path.read_bytes() == b"B" * 40


def test_a_file_chmodded_while_copied_is_still_landed(tmp_path: Path) -> None:
    """A chmod (a backup agent's metadata churn) moves the ctime and not the bytes: the file was
    refused at every look, with a message saying it was written to."""
    paths = StatePaths(home=tmp_path / "home")
    paths.inbox_dir.mkdir(parents=True)
    path = paths.inbox_dir / "seeds.jsonl"
    write_settled(path, b"A" * 40)
    with Landing(paths) as landing, path.open("rb") as reader:
        assignment = landing.assign("seeds.jsonl", arrived=DAY, start=DAY)
        handle = MetadataMovedMidCopy(reader, path, "chmod")
        version = landing.land(path, assignment, max_bytes=MAX_BYTES, handle=handle)  # type: ignore[arg-type]
        assert handle.ctime_moved
        assert version.path.read_bytes() == b"A" * 40
        assert landing.current(assignment.ds, assignment.source) == version


@EXAMPLES
@given(data=st.binary(min_size=8, max_size=300), change=st.sampled_from(METADATA_CHANGES))
def test_a_file_whose_metadata_alone_moves_while_copied_lands_whole(
    data: bytes, change: str
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        source, landed = Path(tmp) / "in", Path(tmp) / "landed"
        landed.mkdir()
        write_settled(source, data)
        with source.open("rb") as reader:
            handle = MetadataMovedMidCopy(reader, source, change)
            snapshot = copy_snapshot(handle, landed, name="in", max_bytes=3000, ext="bin")  # type: ignore[arg-type]
        assert handle.ctime_moved
        assert (snapshot.sha256, snapshot.size) == (sha(data), len(data))
        assert (landed / f"{sha(data)}.bin").read_bytes() == data


def test_a_file_rewritten_while_copied_is_refused_saying_what_moved(tmp_path: Path) -> None:
    """The refusal says what was seen (size, mtime or ctime), not that the file was written to:
    a chmod moves the ctime too."""
    source, landed = tmp_path / "in", tmp_path / "landed"
    landed.mkdir()
    write_settled(source, b"A" * 40)
    time.sleep(0.05)  # the ctime's clock ticks coarsely: the rewrite moves it on a later tick
    with source.open("rb") as reader:
        handle = RewrittenMidCopy(reader, source, b"B" * 40, keep_mtime=True)
        with pytest.raises(InputNotSettledError, match="its size, mtime or ctime moved"):
            copy_snapshot(handle, landed, name="in", max_bytes=3000, ext="bin")  # type: ignore[arg-type]
    assert list(landed.iterdir()) == []


@given(data=st.binary(max_size=100), point=st.sampled_from(CRASH_POINTS))
@settings(max_examples=20, deadline=None)
def test_a_landing_stopped_at_a_crash_point_is_completed_by_the_next(
    data: bytes, point: str
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        paths = StatePaths(home=Path(tmp) / "home")
        paths.inbox_dir.mkdir(parents=True)
        path = paths.inbox_dir / "seeds.jsonl"
        write_settled(path, data)
        with Landing(paths) as landing:
            assignment = landing.assign("seeds.jsonl", arrived=DAY, start=DAY)
            with armed(point), pytest.raises(CrashPointReached):
                landing.land(path, assignment, max_bytes=MAX_BYTES)
            current = landing.current(assignment.ds, assignment.source)
            # A version is recorded only after its snapshot is whole in place.
            if point == "landing.snapshot_copied":
                assert current is None
            else:
                assert current is not None
                assert current.path.read_bytes() == data
        with Landing(paths) as landing:  # the next run
            version = landing.land(path, assignment, max_bytes=MAX_BYTES)
            assert version.path.read_bytes() == data
            with connect_state(paths.manifest_state) as db:
                assert db.execute("SELECT COUNT(*) FROM versions").fetchone() == (1,)


@given(data=st.binary(max_size=200), processes=st.integers(2, 3))
@settings(max_examples=10, deadline=None)
def test_the_same_content_landed_by_several_processes_at_once_is_one_version(
    data: bytes, processes: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        paths = StatePaths(home=Path(tmp) / "home")
        paths.inbox_dir.mkdir(parents=True)
        path = paths.inbox_dir / "seeds.jsonl"
        write_settled(path, data)
        with Landing(paths) as landing:
            assignment = landing.assign("seeds.jsonl", arrived=DAY, start=DAY)
        landed: list[str] = []
        errors: list[BaseException] = []

        def land_once() -> None:
            try:
                with Landing(paths) as own:  # each its own connection, as a process has
                    landed.append(own.land(path, assignment, max_bytes=MAX_BYTES).sha256)
            except BaseException as error:  # reported to the test below
                errors.append(error)

        workers = [threading.Thread(target=land_once) for _ in range(processes)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        assert errors == []
        assert landed == [sha(data)] * processes
        with connect_state(paths.manifest_state) as db:
            assert db.execute("SELECT COUNT(*) FROM versions").fetchone() == (1,)
        assert [p.name for p in paths.landed_dir.iterdir() if "manifest" not in p.name] == [
            f"{sha(data)}.jsonl"
        ]
