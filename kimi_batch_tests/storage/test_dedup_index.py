"""The duplicate index across partitions: exact and near matches, replacement, rollback."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from kimi_batch.storage.dedup_index import DedupIndex, IndexedText, shingles

BASE = (
    "explain why the sky looks blue on a clear afternoon and why sunsets over the sea turn red "
    "while the air above the mountains stays clear and cold through the long winter night"
)


def _index(path: Path, *, shingle: int = 5, fields: str = "prompt") -> DedupIndex:
    return DedupIndex(path, threshold=0.8, shingle=shingle, fields=fields)


def _text(request_id: str, text: str) -> IndexedText:
    return IndexedText(request_id=request_id, input_id=f"in-{request_id}", text=text)


def test_shingles_are_word_ngrams_and_a_short_text_is_one() -> None:
    assert shingles("a b c d", 2) == [b"a b", b"b c", b"c d"]
    assert shingles("a b", 5) == [b"a b"]


def test_a_later_partition_repeating_a_kept_row_names_it(tmp_path: Path) -> None:
    index = _index(tmp_path / "quality" / "dedup.sqlite3")
    with index.partition("2026-12-01", "night") as first:
        assert first.check(_text("a", BASE)) is None
        assert first.check(_text("b", "a different question about tides")) is None
    with index.partition("2026-12-02", "night") as second:
        exact = second.check(_text("c", BASE))
        near = second.check(_text("d", BASE + " again"))
        fresh = second.check(_text("e", "how do volcanoes form"))
    assert exact is not None and exact.kind == "duplicate"
    assert (exact.kept.ds, exact.kept.input_id, exact.similarity) == ("2026-12-01", "in-a", 1.0)
    assert near is not None and near.kind == "near_duplicate"
    assert near.kept.request_id == "a" and 0.8 <= near.similarity < 1.0
    assert fresh is None
    assert index.entries() == 3  # a, b, e: duplicates are not indexed
    mode = stat.S_IMODE(os.stat(tmp_path / "quality" / "dedup.sqlite3").st_mode)
    assert mode == 0o600


def test_a_rebuilt_partition_replaces_its_own_entries(tmp_path: Path) -> None:
    index = _index(tmp_path / "dedup.sqlite3")
    with index.partition("2026-12-01", "night") as first:
        first.check(_text("a", BASE))
    # The same partition again (stale input, a rerun): its old entry is not a duplicate of it.
    with index.partition("2026-12-01", "night") as again:
        assert again.check(_text("a", BASE)) is None
        assert again.check(_text("a2", BASE)) is not None  # inside one partition: the first stays
    assert index.entries() == 1


def test_an_error_inside_the_block_leaves_the_index_as_it_was(tmp_path: Path) -> None:
    index = _index(tmp_path / "dedup.sqlite3")
    with index.partition("2026-12-01", "night") as first:
        first.check(_text("a", BASE))
    with pytest.raises(RuntimeError), index.partition("2026-12-01", "night") as failing:
        failing.check(_text("b", "something else entirely"))
        raise RuntimeError("the Parquet write failed")
    with index.partition("2026-12-02", "night") as later:
        match = later.check(_text("c", BASE))
    assert match is not None and match.kept.request_id == "a"  # a's entry survived the rollback


def test_another_signature_setting_needs_a_rebuild(tmp_path: Path) -> None:
    path = tmp_path / "dedup.sqlite3"
    index = _index(path)
    assert index.needs_rebuild()
    assert index.rebuild([("2026-12-01", "night", [_text("a", BASE)])]) == 1
    assert not index.needs_rebuild()
    assert _index(path, shingle=3).needs_rebuild()
    assert _index(path, fields="prompt+answer").needs_rebuild()
    with index.partition("2026-12-02", "night") as later:
        assert later.check(_text("b", BASE)) is not None
