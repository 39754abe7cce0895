"""Owner-only output folders replaced whole: a swap killed between its two renames loses nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kimi_batch.storage import private_folder_swap

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
