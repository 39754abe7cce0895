"""Landing an inbox file whose name is swapped for a link out of the inbox after it was checked:
a real rename race against the real landing, and the same swap made at a known moment.

The manifest runs on both state backends (`state_backend`: a SQLite file, a PostgreSQL schema).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import date
from pathlib import Path

import pytest

from kimi_batch.inputs import partition_input
from kimi_batch.inputs.inbox import InboxFile
from kimi_batch.inputs.landing import Landing
from kimi_batch.inputs.partition_input import land_inbox, resolve_input
from kimi_batch.paths import StatePaths
from kimi_batch_tests.support.postgres import StateBackend

START = date(2025, 1, 1)
DAY1 = date(2026, 11, 28)
MB = 1 << 20
SECRET = b"API_KEY=hunter2-never-landed"
GOOD = b'{"prompt": "a question from the inbox"}\n'
RACE_S = 2.0


@pytest.fixture
def paths(state_backend: StateBackend) -> StatePaths:
    paths = state_backend.paths
    paths.inbox_dir.mkdir(parents=True)
    return paths


@pytest.fixture
def landing(paths: StatePaths) -> Iterator[Landing]:
    with Landing(paths) as opened:
        yield opened


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A file outside the inbox that the pipeline's user can read (its `~/.env`)."""
    path = tmp_path / "home" / ".env"
    path.parent.mkdir()
    path.write_bytes(SECRET + b"\n")
    return path


def _settled(path: Path) -> Path:
    past = time.time() - 60
    os.utime(path, (past, past), follow_symlinks=False)
    return path


def _landed_bytes(paths: StatePaths) -> list[bytes]:
    return [snapshot.read_bytes() for snapshot in paths.landed_dir.glob("*.jsonl")]


def _swap_to_link(path: Path, target: Path) -> None:
    """`path` replaced by a link to `target` in one rename, as an attacker would."""
    staged = path.with_name(".staged-link")
    staged.symlink_to(target)
    os.replace(staged, path)


# The attacker, in a process of its own (a thread would take turns with the landing under the
# GIL): swaps inbox file PATH between a regular file (a hard link of GOOD) and a link to SECRET,
# each in one rename, until STOP exists, holding each for up to a millisecond (about as long as
# a landing takes from its check to its copy); prints how many swaps it made.
SWAPPER = """
import os, random, sys, time
path, good, secret, stop = sys.argv[1:]
staged_link, staged_file = path + ".staged-link~", path + ".staged-file~"
swaps = 0
while not os.path.exists(stop):
    os.symlink(secret, staged_link)
    os.replace(staged_link, path)
    time.sleep(random.random() / 1000)
    os.link(good, staged_file)
    os.replace(staged_file, path)
    time.sleep(random.random() / 1000)
    swaps += 2
    if swaps == 2:
        open(stop + ".started", "w").close()
print(swaps)
"""


def test_a_link_swapped_in_and_out_while_landing_never_lands_a_byte_from_outside(
    landing: Landing, paths: StatePaths, secret: Path
) -> None:
    inbox = paths.inbox_dir
    good = inbox / ".good"  # a dotfile: never an input itself
    good.write_bytes(GOOD)
    _settled(good)
    path = inbox / "x.jsonl"
    os.link(good, path)
    args = {"max_bytes": MB, "arrived": DAY1, "start": START, "settle_s": 0.0}
    (assignment,) = landing.assign_inbox(inbox, arrived=DAY1, start=START)
    stop = inbox / ".stop"
    swapper = subprocess.Popen(
        [sys.executable, "-c", SWAPPER, str(path), str(good), str(secret), str(stop)],
        stdout=subprocess.PIPE,
        text=True,
    )
    attempts = 0
    try:
        # The race starts with the swapper's first swap (its interpreter may take a while to
        # start on a loaded machine) and runs RACE_S, and at least 12 attempts.
        started = inbox / ".stop.started"
        give_up = time.monotonic() + 60
        while not started.exists():
            assert time.monotonic() < give_up, "the swapper never swapped"
            time.sleep(0.01)
        deadline = time.monotonic() + RACE_S
        while (time.monotonic() < deadline or attempts <= 10) and time.monotonic() < give_up:
            land_inbox(landing, inbox, **args)
            resolve_input(landing, inbox, assignment.ds, assignment.source, **args)
            attempts += 2
    finally:
        stop.touch()
        swaps, _ = swapper.communicate(timeout=30)

    assert int(swaps) > 100  # the race really ran
    assert attempts > 10
    landed = _landed_bytes(paths)
    assert landed == [GOOD]  # the inbox file landed, once
    assert not any(SECRET in content for content in landed)
    current = landing.current(assignment.ds, assignment.source)
    assert current is not None
    assert current.path.read_bytes() == GOOD


def _swapped_after(
    check: Callable[..., InboxFile | None], secret: Path
) -> Callable[..., InboxFile | None]:
    """`check` (the inbox look) that leaves the file swapped for a link to `secret` afterwards."""

    def look(inbox_dir: Path, name: str) -> InboxFile | None:
        item = check(inbox_dir, name)
        _swap_to_link(inbox_dir / name, secret)
        return item

    return look


def test_a_link_in_place_when_the_file_is_opened_is_quarantined_with_the_reason(
    landing: Landing, paths: StatePaths, secret: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inbox = paths.inbox_dir
    path = inbox / "x.jsonl"
    path.write_bytes(GOOD)
    _settled(path)
    (assignment,) = landing.assign_inbox(inbox, arrived=DAY1, start=START)
    real_look = partition_input.inspect_inbox_file
    monkeypatch.setattr(partition_input, "inspect_inbox_file", _swapped_after(real_look, secret))

    resolved = resolve_input(
        landing, inbox, assignment.ds, assignment.source, max_bytes=MB, arrived=DAY1, start=START
    )

    assert resolved.version is None
    assert (
        resolved.problem == "cannot land x.jsonl: x.jsonl: symlink resolves outside the inbox; "
        "its content is never read"
    )
    assert _landed_bytes(paths) == []


def test_the_nights_look_at_the_inbox_refuses_a_link_swapped_in_after_the_scan(
    landing: Landing, paths: StatePaths, secret: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inbox = paths.inbox_dir
    path = inbox / "x.jsonl"
    path.write_bytes(GOOD)
    _settled(path)
    real_scan = partition_input.scan_inbox

    def scan_then_swap(inbox_dir: Path) -> list[InboxFile]:
        found = real_scan(inbox_dir)
        _swap_to_link(path, secret)
        return found

    monkeypatch.setattr(partition_input, "scan_inbox", scan_then_swap)

    result = land_inbox(landing, inbox, max_bytes=MB, arrived=DAY1, start=START, settle_s=0.0)

    assert result.landed == []
    assert len(result.problems) == 1
    assert result.problems[0].startswith("x.jsonl: ")
    assert "symlink resolves outside the inbox" in result.problems[0]
    assert _landed_bytes(paths) == []
