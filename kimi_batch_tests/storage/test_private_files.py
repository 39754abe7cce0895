"""Owner-only output folders replaced whole: a swap killed between its two renames loses nothing;
a file opened for reading only if it is a regular one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kimi_batch.storage import (
    NotRegularFileError,
    open_regular,
    private_folder_swap,
    private_writer,
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


def test_a_write_removes_only_the_temps_of_dead_writers_of_this_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An export's folder may be the user's own: a hidden `.tmp` of their editor, an hour old,
    was deleted by the next export into it; one the exporter could not delete (another user's,
    in a sticky /tmp) crashed the export."""
    folder = tmp_path / "mine"
    folder.mkdir()
    theirs = [folder / ".vim-session.tmp", folder / ".backup.chunk"]
    for path in theirs:
        path.write_text("precious")
        os.utime(path, (0, 0))  # as old as can be
    dead = folder / f".answers.jsonl.{DEAD_PID}-{'a' * 32}.tmp"
    dead.write_text("a killed writer's")
    locked = folder / f".answers.jsonl.{DEAD_PID + 1}-{'b' * 32}.tmp"
    locked.write_text("not ours to remove")
    unlink = os.unlink

    def refuse(path: str | os.PathLike[str]) -> None:
        if Path(path) == locked:
            raise PermissionError(1, "Operation not permitted", str(path))
        unlink(path)

    monkeypatch.setattr(os, "unlink", refuse)
    with private_writer(folder / "answers.jsonl") as out:
        out.write("{}\n")
    assert all(path.read_text() == "precious" for path in theirs)
    assert not dead.exists()
    assert locked.exists()
    assert (folder / "answers.jsonl").read_text() == "{}\n"


@pytest.mark.parametrize("name", ["run[1].hf", "night*.hf", "a?.hf"])
def test_a_name_with_glob_characters_gets_its_older_folder_back(tmp_path: Path, name: str) -> None:
    """`--out run[1].hf`: the sweep looked its temps up with the name as a glob pattern, which
    `[1]` does not match, so a killed swap's older folder was never put back."""
    target = tmp_path / "exports" / name
    _swap(target, "first")
    _killed_between_the_renames(target)
    _swap(target, "second")
    assert (target / "card").read_text() == "second"
    assert [path.name for path in target.parent.iterdir()] == [name]


def test_a_swap_over_a_link_leaves_no_link_aside(tmp_path: Path) -> None:
    """`--out` naming a link to a folder: the swap moves the link aside and renames the new
    folder in; the link aside was kept for ever (rmtree refuses a link), its target untouched."""
    real = tmp_path / "elsewhere"
    _swap(real, "theirs")
    target = tmp_path / "exports" / "latest.hf"
    target.parent.mkdir()
    target.symlink_to(real, target_is_directory=True)
    _swap(target, "mine")
    assert not target.is_symlink()
    assert (target / "card").read_text() == "mine"
    assert [path.name for path in target.parent.iterdir()] == ["latest.hf"]
    assert (real / "card").read_text() == "theirs"  # the link's target is not the export's


def test_a_swap_over_a_link_killed_between_its_renames_gives_the_link_back(
    tmp_path: Path,
) -> None:
    real = tmp_path / "elsewhere"
    _swap(real, "theirs")
    target = tmp_path / "exports" / "latest.hf"
    target.parent.mkdir()
    target.symlink_to(real, target_is_directory=True)
    _killed_between_the_renames(target)
    with pytest.raises(RuntimeError):
        _swap(target, "mine", fail=True)
    assert target.is_symlink()
    assert (target / "card").read_text() == "theirs"
    assert [path.name for path in target.parent.iterdir()] == ["latest.hf"]


def test_a_sweep_leaves_the_temps_of_a_name_its_glob_characters_would_match(
    tmp_path: Path,
) -> None:
    """`a?.hf` as a pattern matches `ab.hf`: a swap of `a?.hf` removed `ab.hf`'s folders aside."""
    parent = tmp_path / "exports"
    _swap(parent / "ab.hf", "theirs")
    _killed_between_the_renames(parent / "ab.hf")
    _swap(parent / "a?.hf", "mine")
    aside = f".ab.hf.old.{DEAD_PID}-{'0' * 32}.tmp"
    assert sorted(path.name for path in parent.iterdir()) == [aside, "a?.hf"]
    assert (parent / aside / "card").read_text() == "theirs"  # the next swap of ab.hf's


@pytest.mark.timeout(60)
def test_a_fifo_is_refused_at_once_and_a_regular_file_read_through_its_link(
    tmp_path: Path,
) -> None:
    """Opening a FIFO for reading blocks until a writer comes: it is refused, never waited on."""
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "to_pipe").symlink_to(tmp_path / "pipe")
    for name in ("pipe", "to_pipe"):
        with pytest.raises(NotRegularFileError, match=f"^{name}: not a regular file"):
            open_regular(tmp_path / name)
    (tmp_path / "rows.jsonl").write_bytes(b'{"prompt": "x"}\n')
    (tmp_path / "to_rows").symlink_to(tmp_path / "rows.jsonl")
    with open_regular(tmp_path / "to_rows") as reader:
        assert reader.read() == b'{"prompt": "x"}\n'
        assert os.get_blocking(reader.fileno())  # a reader may wait on a slow disk, not spin
