"""The duplicate index across partitions: exact and near matches, replacement, rollback, the lock
taken only once rows come, a rebuild under another setting; on both state backends (a SQLite
file, a PostgreSQL schema several workers share)."""

from __future__ import annotations

import os
import stat
import unicodedata
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kimi_batch.engine import LeaseLostError
from kimi_batch.paths import StateLocation, StatePaths
from kimi_batch.quality import dedup_index as dedup_module
from kimi_batch.quality.dedup_index import (
    DedupIndex,
    DedupSetting,
    IndexedText,
    index_entries,
    normalize_text,
    rescreen_partitions,
    shingles,
)
from kimi_batch.state import StateBusyError, connect_state
from kimi_batch_tests.support.postgres import PostgresServer, StateBackend

BASE = (
    "explain why the sky looks blue on a clear afternoon and why sunsets over the sea turn red "
    "while the air above the mountains stays clear and cold through the long winter night"
)
# Half of BASE's words replaced: its shingles mostly differ.
HALF = (
    "explain why the sky looks blue on a clear afternoon and why sunsets over the sea turn red "
    "but tell me how volcanoes form under the ocean floor and why islands rise from them"
)


def _index(location: StateLocation, *, shingle: int = 5, fields: str = "prompt") -> DedupIndex:
    return DedupIndex(location, DedupSetting(threshold=0.8, shingle=shingle, fields=fields))


def _text(request_id: str, text: str) -> IndexedText:
    return IndexedText(request_id=request_id, input_id=f"in-{request_id}", text=text)


def test_shingles_are_word_ngrams_and_a_short_text_is_one() -> None:
    assert shingles("a b c d", 2) == [b"a b", b"b c", b"c d"]
    assert shingles("a b", 5) == [b"a b"]


def test_a_later_partition_repeating_a_kept_row_names_it(state_backend: StateBackend) -> None:
    location = state_backend.paths.dedup_state
    index = _index(location)
    with index.partition("2026-12-01", "night") as first:
        assert first.check(_text("a", BASE)) is None
        assert first.check(_text("b", "a different question about tides")) is None
    with index.partition("2026-12-02", "night") as second:
        exact = second.check(_text("c", BASE))
        near = second.check(_text("d", BASE + " again"))
        apart = second.check(_text("e", HALF))
        fresh = second.check(_text("f", "how do volcanoes form"))
    assert exact is not None
    assert exact.kind == "duplicate"
    assert (exact.kept.ds, exact.kept.input_id, exact.similarity) == ("2026-12-01", "in-a", 1.0)
    assert near is not None
    assert near.kind == "near_duplicate"
    assert near.kept.request_id == "a"
    assert 0.8 <= near.similarity < 1.0
    assert apart is None  # shares a prefix, not 80% of its shingles
    assert fresh is None
    assert index_entries(location) == 4  # a, b, e, f: duplicates are not indexed
    if location.embedded:
        assert stat.S_IMODE(os.stat(location.path).st_mode) == 0o600


def test_a_rebuilt_partition_replaces_its_own_entries(state_backend: StateBackend) -> None:
    index = _index(state_backend.paths.dedup_state)
    with index.partition("2026-12-01", "night") as first:
        first.check(_text("a", BASE))
        first.check(_text("b", HALF))
    # The same partition again (a rerun): its old entries are no duplicates of it.
    with index.partition("2026-12-01", "night") as again:
        assert again.check(_text("a", BASE)) is None
        assert again.check(_text("a2", BASE)) is not None  # inside one partition: the first stays
    # Rebuilt without HALF (a stale input): its entry is gone, another partition may keep it.
    with index.partition("2026-12-02", "night") as later:
        assert later.check(_text("c", HALF)) is None
        assert later.check(_text("d", BASE)) is not None
    assert index_entries(index.location) == 2


def test_an_error_or_a_lost_lease_leaves_the_index_as_it_was(state_backend: StateBackend) -> None:
    index = _index(state_backend.paths.dedup_state)
    with index.partition("2026-12-01", "night") as first:
        first.check(_text("a", BASE))

    def fails_mid_way() -> None:
        with index.partition("2026-12-01", "night") as failing:
            failing.check(_text("b", "something else entirely"))
            raise RuntimeError("the Parquet write failed")

    with pytest.raises(RuntimeError):
        fails_mid_way()

    def lost() -> None:
        raise LeaseLostError("2026-12-02|night", "taken over")

    with pytest.raises(LeaseLostError), index.partition("2026-12-02", "night", guard=lost) as gone:
        assert gone.check(_text("c", HALF)) is None
    with index.partition("2026-12-03", "night") as later:
        match = later.check(_text("d", BASE))
        assert later.check(_text("e", HALF)) is None  # c was never committed
    assert match is not None
    assert match.kept.request_id == "a"  # a's entry survived the rollback


def test_the_index_is_taken_at_the_first_row_not_before(
    state_backend: StateBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partition whose block is open but has no row yet (a stage asking again generates then)
    does not hold another partition's landing."""
    monkeypatch.setattr(dedup_module, "_BUSY_TIMEOUT_S", 0.5)
    index = _index(state_backend.paths.dedup_state)
    with index.partition("2026-12-01", "slow") as waiting:
        with index.partition("2026-12-01", "quick") as quick:
            assert quick.check(_text("q", BASE)) is None
        match = waiting.check(_text("w", BASE))
        assert match is not None
        assert match.kept.source == "quick"
        third = index.partition("2026-12-01", "third")
        with pytest.raises(StateBusyError), third as screen:
            screen.check(_text("t", HALF))  # now the slow one holds it


def test_another_setting_rebuilds_the_index_from_what_is_kept(state_backend: StateBackend) -> None:
    location = state_backend.paths.dedup_state
    with _index(location).partition("2026-12-01", "night") as first:
        first.check(_text("a", BASE))
    calls: list[str] = []

    def landed() -> list[tuple[str, str, list[IndexedText]]]:
        calls.append("rebuild")
        return [
            ("2026-11-30", "night", [_text("old", HALF)]),
            ("2026-12-02", "night", [_text("mine", "what this partition held before")]),
        ]

    three = _index(location, shingle=3)
    with three.partition("2026-12-02", "night", rebuild=landed) as screen:
        assert screen.check(_text("b", HALF + " again")) is not None
        assert screen.check(_text("c", BASE)) is None  # a was dropped: landed() is what is kept
        assert screen.rebuilt == 1  # its own partition is screened now, not rebuilt
    with three.partition("2026-12-03", "night", rebuild=landed) as later:
        assert later.check(_text("d", "what this partition held before")) is None
    assert calls == ["rebuild"]
    assert index_entries(location) == 3


def test_an_index_made_before_contexts_gains_them_and_is_rebuilt(
    state_backend: StateBackend,
) -> None:
    """An index of the version before rows were judged under their context: its kept table has
    no `context` column and its stamp another text version. It opens, is rebuilt from what is
    landed, and a row repeats a kept one only under the same context."""
    location = state_backend.paths.dedup_state
    with connect_state(location) as db:
        db.create(
            [
                """CREATE TABLE kept (id {serial}, ds TEXT NOT NULL, source TEXT NOT NULL,
                request_id TEXT NOT NULL, input_id TEXT NOT NULL, exact {blob} NOT NULL,
                signature {blob} NOT NULL)""",
                "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
            ]
        )
        with db.transaction():
            db.execute("INSERT INTO meta (key, value) VALUES ('setting', 'an older stamp')")

    def landed() -> list[tuple[str, str, list[IndexedText]]]:
        kept = IndexedText(request_id="old", input_id="in-old", text=BASE, context="passage a")
        return [("2026-11-30", "night", [kept])]

    with _index(location).partition("2026-12-01", "night", rebuild=landed) as screen:
        other = IndexedText(request_id="b", input_id="in-b", text=BASE, context="passage b")
        assert screen.check(other) is None  # the same question under another context
        same = IndexedText(request_id="c", input_id="in-c", text=BASE, context="passage a")
        match = screen.check(same)
        assert match is not None
        assert match.kept.request_id == "old"
        assert screen.rebuilt == 1
    assert index_entries(location) == 2


def test_status_reads_no_index_as_none_and_creates_nothing(state_backend: StateBackend) -> None:
    location = state_backend.paths.dedup_state
    assert index_entries(location) is None
    assert index_entries(location) is None  # the first read created no schema either
    assert not location.path.parent.exists()


def test_workers_on_one_postgresql_screen_against_each_others_rows(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    """Two hosts (own state dirs, one database): a row one kept is a duplicate for the other."""
    url = postgres_server.new_database()
    here, there = (
        StatePaths(home=tmp_path / host, database_url=url).dedup_state for host in ("a", "b")
    )
    with _index(here).partition("2026-12-01", "host-a") as first:
        assert first.check(_text("a", BASE)) is None
    with _index(there).partition("2026-12-01", "host-b") as second:
        match = second.check(_text("b", BASE + " again"))
    assert match is not None
    assert (match.kind, match.kept.source) == ("near_duplicate", "host-a")


def test_repeats_of_a_row_that_left_are_marked_to_be_screened_again(
    state_backend: StateBackend,
) -> None:
    """Its partition rebuilt without the kept row: the partitions holding its repeats are named
    (their set-aside rows repeat nothing now); screened again, they keep them and lose the mark."""
    location = state_backend.paths.dedup_state
    index = _index(location)
    with index.partition("2026-12-01", "night") as first:
        assert first.check(_text("a", BASE)) is None
        assert first.check(_text("b", "a different question about tides")) is None
    with index.partition("2026-12-02", "night") as second:
        assert second.check(_text("c", BASE)) is not None  # exact
    with index.partition("2026-12-03", "night") as third:
        assert third.check(_text("d", BASE + " again")) is not None  # near
    # Rebuilt with the same rows: nothing to screen again.
    with index.partition("2026-12-01", "night") as same:
        same.check(_text("a", BASE))
        same.check(_text("b", "a different question about tides"))
    assert rescreen_partitions(location) == []
    # Rebuilt without BASE (its input changed).
    with index.partition("2026-12-01", "night") as rebuilt:
        assert rebuilt.check(_text("b", "a different question about tides")) is None
    assert rescreen_partitions(location) == [("2026-12-02", "night"), ("2026-12-03", "night")]
    with index.partition("2026-12-02", "night") as again:
        assert again.check(_text("c", BASE)) is None  # no longer a repeat: kept
    assert rescreen_partitions(location) == [("2026-12-03", "night")]
    with index.partition("2026-12-03", "night") as again:
        match = again.check(_text("d", BASE + " again"))
    assert match is not None
    assert match.kept.request_id == "c"  # the row kept now
    assert rescreen_partitions(location) == []


def test_a_row_gone_from_the_warehouse_is_never_answered(state_backend: StateBackend) -> None:
    """Its partition landed again with the gate off: the caller says the row is gone; the index
    drops it, keeps the new row, and marks the partition that held a repeat of it."""
    location = state_backend.paths.dedup_state
    index = _index(location)
    with index.partition("2026-12-01", "night") as first:
        assert first.check(_text("a", BASE)) is None
    with index.partition("2026-12-02", "night") as second:
        assert second.check(_text("b", BASE)) is not None
    with index.partition("2026-12-03", "night", alive=lambda kept: kept.request_id != "a") as third:
        assert third.check(_text("c", BASE + " again")) is None
        assert third.check(_text("d", BASE)) is not None  # c stands now: d repeats it
    assert rescreen_partitions(location) == [("2026-12-02", "night")]
    assert index_entries(location) == 1  # c; a is gone


def test_a_rebuild_without_the_kept_row_marks_its_repeats(state_backend: StateBackend) -> None:
    location = state_backend.paths.dedup_state
    with _index(location).partition("2026-12-01", "night") as first:
        assert first.check(_text("a", BASE)) is None
    with _index(location).partition("2026-12-02", "night") as second:
        assert second.check(_text("b", BASE)) is not None
    # Another setting: rebuilt from what the warehouse holds, where "a" is no longer.
    landed = [("2026-12-01", "night", [_text("other", HALF)])]
    with _index(location, shingle=3).partition("2026-12-03", "night", rebuild=lambda: landed):
        pass
    assert rescreen_partitions(location) == [("2026-12-02", "night")]


def test_a_partition_landed_unscreened_leaves_the_index(state_backend: StateBackend) -> None:
    location = state_backend.paths.dedup_state
    index = _index(location)
    index.release("2026-12-01", "night")  # no index yet: none is made
    assert index_entries(location) is None
    with index.partition("2026-12-01", "night") as first:
        assert first.check(_text("a", BASE)) is None
    with index.partition("2026-12-02", "night") as second:
        assert second.check(_text("b", BASE)) is not None
    index.release("2026-12-01", "night")
    assert index_entries(location) == 0
    assert rescreen_partitions(location) == [("2026-12-02", "night")]
    with index.partition("2026-12-03", "night") as third:
        assert third.check(_text("c", BASE)) is None


# Hostile input (hypothesis): any script, controls, joiners, odd whitespace.
CHARACTERS = st.one_of(
    st.characters(exclude_categories=["Cs"]),
    st.sampled_from("+-*/<>=!?#.,;:%$^~|&@2xX東京タワーภาษาไทยдЖ\u0301\u200d\x00\x1b\t\n\u3000"),
)


def _fold(character: str) -> str:
    return unicodedata.normalize("NFC", unicodedata.normalize("NFC", character).casefold())


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],  # one index, unique texts
)
@given(st.text(CHARACTERS, min_size=1, max_size=30), st.data())
def test_only_a_case_or_spacing_variant_is_an_exact_duplicate(
    state_backend: StateBackend, hostile: str, data: st.DataObject
) -> None:
    index = _index(state_backend.paths.dedup_state)
    unique = uuid.uuid4().hex  # the examples share the index: no text repeats another's
    position = data.draw(st.integers(0, len(hostile) - 1))
    other = data.draw(
        CHARACTERS.filter(lambda c: not c.isspace() and _fold(c) != _fold(hostile[position]))
    )
    changed = hostile[:position] + other + hostile[position + 1 :]
    stable = all(_fold(c.upper()) == _fold(c) == _fold(c.lower()) for c in hostile)
    variant = hostile.swapcase() if stable else hostile
    with index.partition("2026-12-01", unique) as screen:
        assert screen.check(_text("base", normalize_text(f"{unique} {hostile}"))) is None
        again = screen.check(_text("again", normalize_text(f"\n {unique}\u3000 {variant}\t")))
        different = screen.check(_text("changed", normalize_text(f"{unique} {changed}")))
    assert again is not None
    assert (again.kind, again.kept.request_id) == ("duplicate", "base")
    assert different is None or different.kind == "near_duplicate"
