"""The quality gate over distilled rows: reasons, counts, the index rebuilt from landed answers."""

from __future__ import annotations

import json
from pathlib import Path

from kimi_batch.settings import QualitySettings
from kimi_batch.storage import QualityGate, Warehouse
from kimi_batch_tests.support.rows import answer

PROMPT = (
    "write a short story about a lighthouse keeper who finds a message in a bottle that was "
    "sent forty years ago by her own grandmother from a ship lost at sea"
)
BENCHMARK_ITEM = (
    "a robe takes 2 bolts of blue fiber and half that much white fiber how many bolts in total "
    "does it take"
)


def _gate(tmp_path: Path, **fields: object) -> QualityGate:
    return QualityGate(QualitySettings(**fields), tmp_path / "quality" / "dedup.sqlite3")  # pyright: ignore[reportArgumentType]


def test_duplicates_and_contamination_are_set_aside_with_their_reasons(tmp_path: Path) -> None:
    bench = tmp_path / "gsm8k.jsonl"
    bench.write_text(json.dumps({"id": "train-3", "question": BENCHMARK_ITEM}) + "\n")
    gate = _gate(tmp_path, benchmarks=(bench,))
    store = Warehouse(tmp_path / "warehouse")
    rows = [
        answer("r1", PROMPT),
        answer("r2", PROMPT.upper() + "!"),  # the same prompt once normalized
        answer("r3", PROMPT.replace("at sea", "at sea tonight")),  # a word more
        answer("r4", "solve this: " + BENCHMARK_ITEM),
        answer("r5", "what is a prime number", response="it says: " + BENCHMARK_ITEM),
        answer("r6", "name three rivers in africa"),
    ]
    with gate.partition(store, "distilled", "distill", "2026-12-01", "night") as screen:
        kept = [row.request_id for row in screen.admit(rows)]
    assert kept == ["r1", "r6"]
    reasons = {row.request_id: row.reason for row in screen.quarantined}
    assert reasons["r2"].startswith("duplicate of input 'in-r1' kept in 2026-12-01|night")
    assert reasons["r3"].startswith("near_duplicate of input 'in-r1'")
    assert "similarity 0." in reasons["r3"]
    for contaminated in ("r4", "r5"):
        assert reasons[contaminated].startswith("contaminated: shares 13 words with benchmark")
        assert "gsm8k.jsonl item 'train-3'" in reasons[contaminated]
    assert {row.stage for row in screen.quarantined} == {"distill"}
    assert screen.metadata() == {
        "duplicates": 1,
        "near_duplicates": 1,
        "contaminated": 2,
        "contamination_rate": round(2 / 6, 4),
    }


def test_a_new_index_starts_from_the_answers_already_landed(tmp_path: Path) -> None:
    store = Warehouse(tmp_path / "warehouse")
    store.write_partition("distilled", "2026-11-30", "night", [answer("old", PROMPT)])
    gate = _gate(tmp_path)
    with gate.partition(store, "distilled", "distill", "2026-12-01", "night") as screen:
        kept = list(screen.admit([answer("new", PROMPT), answer("other", "how do tides work")]))
    assert [row.request_id for row in kept] == ["other"]
    assert "kept in 2026-11-30|night" in screen.quarantined[0].reason
    assert gate.index.entries() == 2


def test_with_dedup_off_and_no_benchmarks_the_gate_is_inactive(tmp_path: Path) -> None:
    gate = _gate(tmp_path, dedup=False)
    assert not gate.active
    store = Warehouse(tmp_path / "warehouse")
    with gate.partition(store, "distilled", "distill", "2026-12-01", "night") as screen:
        kept = list(screen.admit([answer("a", PROMPT), answer("b", PROMPT)]))
    assert len(kept) == 2 and screen.metadata() == {}


def test_prompt_and_answer_keeps_two_different_answers_to_one_prompt(tmp_path: Path) -> None:
    gate = _gate(tmp_path, dedup_fields="prompt+answer")
    store = Warehouse(tmp_path / "warehouse")
    first = answer("a", PROMPT, response="the keeper reads the note by lamplight and weeps")
    second = answer("b", PROMPT, response="a storm breaks the bottle before anyone can read it")
    with gate.partition(store, "distilled", "distill", "2026-12-01", "night") as screen:
        kept = list(screen.admit([first, second, first.model_copy(update={"request_id": "c"})]))
    assert [row.request_id for row in kept] == ["a", "b"]
