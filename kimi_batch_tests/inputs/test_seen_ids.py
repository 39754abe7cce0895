"""Duplicate detection in a compact table: exact for distinct ids, lines kept, grows as needed."""

from __future__ import annotations

from kimi_batch.inputs.seen_ids import SeenIds


def test_ids_are_recorded_once_with_their_first_line() -> None:
    seen = SeenIds()
    total = 50_000  # past several doublings of the table

    assert all(seen.add(f"id-{index}", index + 1) for index in range(total))
    assert len(seen) == total
    assert not seen.add("id-123", 999_999)
    assert seen.first_line("id-123") == 124
    assert seen.first_line("id-49999") == 50_000
    assert "id-0" in seen
    assert "id-50000" not in seen
    assert seen.first_line("never seen") is None
    assert len(seen) == total


def test_ids_without_a_line_and_odd_text() -> None:
    seen = SeenIds()

    assert seen.add("", None)
    assert seen.add("h-0123456789abcdef", None)
    assert seen.add("日本", 3)
    assert not seen.add("日本", 4)
    assert seen.first_line("日本") == 3
    assert seen.first_line("") is None  # seen, without a line
    assert "" in seen
    assert 42 not in seen
