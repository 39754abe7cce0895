"""Owner-only output folders replaced whole: a swap killed between its two renames loses nothing.
A process is told from a later owner of its pid."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kimi_batch.storage import (
    private_folder_swap,
    process_running,
    process_stat,
    process_token,
)

# Above the kernel's largest pid_max (2**22): never a live process.
DEAD_PID = (1 << 22) + 7


def _swap(target: Path, text: str, *, fail: bool = False) -> None:
    with private_folder_swap(target) as folder:
        (folder / "card").write_text(text)
        if fail:
            raise RuntimeError("the export failed")


def _killed_between_the_renames(target: Path) -> None:
    """What a swap killed after moving the older folder aside leaves: nothing at `target`."""
    os.replace(target, target.parent / f".{target.name}.old.{DEAD_PID}-{'0' * 32}.tmp")


def test_a_swap_killed_between_its_renames_gives_the_older_folder_back(tmp_path: Path) -> None:
    target = tmp_path / "exports" / "night.hf"
    _swap(target, "first")
    _killed_between_the_renames(target)
    with pytest.raises(RuntimeError):
        _swap(target, "second", fail=True)
    # The next swap failed too: the older folder is still there, whole, and nothing else.
    assert (target / "card").read_text() == "first"
    assert [path.name for path in target.parent.iterdir()] == ["night.hf"]


def test_the_swap_after_a_killed_one_replaces_the_older_folder(tmp_path: Path) -> None:
    target = tmp_path / "exports" / "night.hf"
    _swap(target, "first")
    _killed_between_the_renames(target)
    _swap(target, "second")
    assert (target / "card").read_text() == "second"
    assert [path.name for path in target.parent.iterdir()] == ["night.hf"]


def test_a_process_is_read_past_a_command_name_that_looks_like_stat_fields() -> None:
    """/proc/PID/stat puts the command name in parentheses, and a process may name itself
    anything: the fields are counted after the last ')'. A zombie has exited; a reaped one is
    gone; a token names one process, not its pid's later owner."""
    renamed = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import pathlib, sys, time; pathlib.Path('/proc/self/comm').write_text('a) Z 1 (b');"
            " print('ready', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert renamed.stdout is not None
        assert renamed.stdout.readline() == "ready\n"
        assert "a) Z 1 (b" in Path(f"/proc/{renamed.pid}/stat").read_text()
        stat = process_stat(renamed.pid)
        assert stat is not None
        assert not stat.exited, stat
        token = process_token(renamed.pid)
        assert token == f"{renamed.pid}.{stat.start_ticks}"
        assert process_running(token)
        assert not process_running(f"{renamed.pid}.{stat.start_ticks + 1}")  # a later process
        renamed.kill()
        deadline = time.monotonic() + 10
        while (zombie := process_stat(renamed.pid)) is not None and not zombie.exited:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert zombie is not None
        assert zombie.state == "Z"
        assert not process_running(token)
    finally:
        renamed.kill()
        renamed.wait()
    assert process_stat(renamed.pid) is None
    assert not process_running(token)
