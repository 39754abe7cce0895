"""The night's look at the whole inbox (`land_inbox`): it reads only what changed since it last
hashed a file, and for a bounded time per look."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import BinaryIO

import pytest

from kimi_batch.inputs import Landing, land_inbox, partition_input
from kimi_batch.settings import Settings
from kimi_batch_tests.support.postgres import StateBackend

DAY = date(2025, 6, 1)
OLD_S = 600  # written this long ago: settled


@pytest.fixture
def settings(state_backend: StateBackend, monkeypatch: pytest.MonkeyPatch) -> Settings:
    state_backend.apply(monkeypatch)
    return Settings.from_env()


@pytest.fixture
def landing(settings: Settings) -> Iterator[Landing]:
    with Landing(settings.paths) as opened:
        yield opened


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The files the look hashes (each hash reads a file whole), by name."""
    seen: list[str] = []
    real = partition_input.sha256_of

    def counted(handle: BinaryIO) -> str:
        # The file is hashed from its open descriptor: its name is the one the descriptor has.
        seen.append(Path(os.readlink(f"/proc/self/fd/{handle.fileno()}")).name)
        return real(handle)

    monkeypatch.setattr(partition_input, "sha256_of", counted)
    return seen


def _settled(path: Path, text: str, *, mtime: float | None = None) -> float:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    when = time.time() - OLD_S if mtime is None else mtime
    os.utime(path, (when, when))
    return when


def _look(
    settings: Settings, landing: Landing, budget_s: float | None = None
) -> partition_input.InboxLanding:
    if budget_s is None:  # the default budget (a call the code before budgets took too)
        return land_inbox(
            landing,
            settings.paths.inbox_dir,
            max_bytes=settings.max_input_bytes,
            arrived=DAY,
            start=DAY,
        )
    return land_inbox(
        landing,
        settings.paths.inbox_dir,
        max_bytes=settings.max_input_bytes,
        arrived=DAY,
        start=DAY,
        hash_budget_s=budget_s,
    )


def _inbox(settings: Settings, count: int) -> list[Path]:
    paths = [settings.paths.inbox_dir / f"f{i}.jsonl" for i in range(count)]
    for i, path in enumerate(paths):
        _settled(path, f'{{"prompt": "question {i}"}}\n')
    return paths


def test_a_second_look_at_an_unchanged_inbox_reads_no_file(
    settings: Settings, landing: Landing, reads: list[str]
) -> None:
    _inbox(settings, 3)
    first = _look(settings, landing)
    assert len(first.landed) == 3
    assert sorted(reads) == ["f0.jsonl", "f1.jsonl", "f2.jsonl"]
    reads.clear()
    second = _look(settings, landing)
    assert reads == []  # nothing hashed: every stat matched its last hash
    assert (second.landed, second.problems, second.unread) == ([], [], [])


def test_a_file_rewritten_with_the_same_size_and_mtime_is_still_landed(
    settings: Settings, landing: Landing, reads: list[str]
) -> None:
    [path] = _inbox(settings, 1)
    mtime = path.stat().st_mtime
    _look(settings, landing)
    time.sleep(0.01)  # the rewrite's ctime is later
    _settled(path, '{"prompt": "question 9"}\n', mtime=mtime)  # same size, mtime put back
    reads.clear()
    again = _look(settings, landing)
    assert reads == ["f0.jsonl"]
    [version] = again.landed
    assert version.sha256 == landing.current(version.ds, version.source).sha256  # type: ignore[union-attr]
    assert landing.earlier_landings(version.ds, version.source, version.sha256) == 0


def test_a_look_out_of_time_leaves_the_rest_to_the_next_look(
    settings: Settings, landing: Landing, reads: list[str]
) -> None:
    _inbox(settings, 3)
    looks = [_look(settings, landing, budget_s=0.0) for _ in range(4)]
    # One file a look (the first is always read, so every look makes progress).
    assert [len(look.landed) for look in looks] == [1, 1, 1, 0]
    assert [len(look.unread) for look in looks] == [2, 1, 0, 0]
    assert len(reads) == 3  # each file hashed once over the four looks


def test_a_rewrite_behind_a_link_inside_the_inbox_is_landed(
    settings: Settings, landing: Landing, reads: list[str]
) -> None:
    # A link inside the inbox is read through to its target (`open_inbox_file`): the look must
    # see the target's changes, not the link's own unchanged stat.
    inbox = settings.paths.inbox_dir
    target = inbox / "staging" / "real.jsonl"  # not a dated folder: never an input itself
    _settled(target, '{"prompt": "first"}\n')
    (inbox / "x.jsonl").symlink_to(target.relative_to(inbox))
    [first] = _look(settings, landing).landed
    assert reads == ["real.jsonl"]
    reads.clear()
    _settled(target, '{"prompt": "second, rewritten"}\n')

    again = _look(settings, landing)

    assert (again.hashed, reads) == (1, ["real.jsonl"])
    [second] = again.landed
    assert second.sha256 != first.sha256
    current = landing.current(first.ds, first.source)
    assert current is not None
    assert current.path.read_text() == '{"prompt": "second, rewritten"}\n'
    reads.clear()
    assert _look(settings, landing).hashed == 0  # its fingerprint is now the target's
    assert reads == []
