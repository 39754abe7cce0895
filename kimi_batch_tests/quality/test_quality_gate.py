"""The quality gate over distilled rows: what each row is judged on, the reasons and counts, the
index rebuilt from answers already landed, the totals `status` reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kimi_batch.inputs.prompts import seeds_from_rows
from kimi_batch.paths import StatePaths
from kimi_batch.pipeline import DistilledRow, DistillInputs, DistillTask, SetAside
from kimi_batch.quality import QualityGate, set_aside_totals
from kimi_batch.quality.dedup_index import rescreen_partitions
from kimi_batch.settings import QualitySettings
from kimi_batch.warehouse import Warehouse
from kimi_batch_tests.support.postgres import StateBackend
from kimi_batch_tests.support.quality import (
    BENCHMARK_ITEM,
    answers_to,
    benchmark_file,
    land_seeds_of,
    seed_row,
)
from kimi_batch_tests.support.rows import amplified, quarantined

PROMPT = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle that was "
    "sent forty years ago by her own grandmother from a ship lost at sea."
)
TASK = DistillTask()


def _gate(tmp_path: Path, **fields: Any) -> QualityGate:
    return QualityGate(QualitySettings(**fields), StatePaths(home=tmp_path).dedup_state)


def _rows(inputs: DistillInputs, source: str) -> list[DistilledRow]:
    parsed = [TASK.parse(result, inputs) for result in answers_to(TASK, inputs, source)]
    return [row for row in parsed if not isinstance(row, SetAside)]


def test_duplicates_and_contamination_are_set_aside_with_their_reasons(tmp_path: Path) -> None:
    gate = _gate(tmp_path, benchmarks=(benchmark_file(tmp_path),))
    store = Warehouse(tmp_path / "warehouse")
    prompts = [
        PROMPT,
        # The same prompt but for case and spacing (only those are folded: "." and "!" differ).
        PROMPT.upper().replace(" ", "  \n"),
        PROMPT.replace("lost at sea.", "lost at sea that night."),  # two words more
        f"Solve this: {BENCHMARK_ITEM}",
        "Name three rivers in Africa.",
    ]
    inputs = land_seeds_of(store, "2026-12-01", "night", prompts)
    with gate.partition(store, TASK, inputs, "2026-12-01", "night") as screen:
        kept = [row.input_id for row in screen.admit(_rows(inputs, "night"))]

    assert kept == ["night-0", "night-4"]
    reasons = {row.input_id: row.reason for row in screen.quarantined}
    assert reasons["night-1"].startswith("duplicate of input 'night-0' kept in 2026-12-01|night")
    assert reasons["night-1"].endswith("similarity 1.00)")
    assert reasons["night-2"].startswith("near_duplicate of input 'night-0'")
    assert reasons["night-3"].startswith(
        "contaminated: the prompt shares 13 words with benchmark bakery_eval.jsonl item 'bake-1'"
    )
    aside = {row.input_id: row for row in screen.quarantined}
    assert (aside["night-2"].stage, aside["night-2"].source_file, aside["night-2"].line) == (
        "distill",
        "night.jsonl",
        3,
    )
    assert aside["night-1"].raw == prompts[1]  # the offending text
    assert screen.metadata() == {
        "duplicates": 1,
        "near_duplicates": 1,
        "dedup_index_rebuilt_rows": 0,  # a new index: built from the (empty) warehouse
        "contaminated": 1,
        "contamination_rate": 0.2,
    }


def test_an_answer_quoting_a_benchmark_is_contaminated_too(tmp_path: Path) -> None:
    gate = _gate(tmp_path, benchmarks=(benchmark_file(tmp_path),), dedup=False)
    store = Warehouse(tmp_path / "warehouse")
    inputs = land_seeds_of(store, "2026-12-01", "night", ["Give me a word problem."])
    (row,) = _rows(inputs, "night")
    quoting = row.model_copy(update={"response": f"Here is one. {BENCHMARK_ITEM}"})
    with gate.partition(store, TASK, inputs, "2026-12-01", "night") as screen:
        assert list(screen.admit([quoting])) == []
    (aside,) = screen.quarantined
    assert aside.reason.startswith("contaminated: the answer shares 13 words")
    assert "item 'bake-1'" in aside.reason
    assert not (tmp_path / "quality").exists()  # dedup off: no index


def test_a_new_index_starts_from_the_answers_already_landed(
    tmp_path: Path, state_backend: StateBackend
) -> None:
    """As after `kimi-batch state migrate` to PostgreSQL, which copies no index."""
    store = Warehouse(tmp_path / "warehouse")
    old = land_seeds_of(store, "2026-11-30", "early", [PROMPT])
    store.write_partition("distilled", "2026-11-30", "early", _rows(old, "early"))
    gate = QualityGate(QualitySettings(), state_backend.paths.dedup_state)
    inputs = land_seeds_of(store, "2026-12-01", "night", [PROMPT, "How do tides work?"])
    with gate.partition(store, TASK, inputs, "2026-12-01", "night") as screen:
        kept = [row.input_id for row in screen.admit(_rows(inputs, "night"))]
    assert kept == ["night-1"]
    assert "of input 'early-0' kept in 2026-11-30|early" in screen.quarantined[0].reason
    assert screen.metadata()["dedup_index_rebuilt_rows"] == 1


def test_the_whole_conversation_is_the_prompt(tmp_path: Path) -> None:
    """The same last question after other turns, or under other instructions, is no repeat."""
    store = Warehouse(tmp_path / "warehouse")
    rows = [
        seed_row("plain", "Why?"),
        seed_row("sky", "Why?", turns=["The sky is blue.", "Yes, it is blue."], line=2),
        seed_row("terse", "Why?", instructions="Answer in one word.", line=3),
        seed_row("again", "  WHY? ", line=4),  # case and spacing only
    ]
    store.write_partition("seeds", "2026-12-01", "night", rows)
    inputs = DistillInputs(seeds=seeds_from_rows(rows))
    with _gate(tmp_path).partition(store, TASK, inputs, "2026-12-01", "night") as screen:
        kept = [row.input_id for row in screen.admit(_rows(inputs, "night"))]
    assert kept == ["plain", "sky", "terse"]
    assert screen.quarantined[0].reason.startswith("duplicate of input 'plain'")


PASSAGE = (
    "The Hanseatic League was a commercial and defensive confederation of merchant guilds and "
    "market towns in Central and Northern Europe. Growing from a few North German towns in the "
    "late twelfth century, the League came to dominate Baltic maritime trade for three "
    "centuries along the coasts of Northern Europe. Its hubs were Lubeck and Hamburg, and its "
    "foreign offices, the Kontors, stood in Bruges, London, Bergen and Novgorod, where grain, "
    "timber, furs, wax, amber and salted fish were traded for cloth and wine from the west."
)


LED = "Which city led the league during most of its three centuries of Baltic trade?"


def test_questions_about_one_document_are_different_rows_and_repeats_under_it_are_not(
    tmp_path: Path,
) -> None:
    """A long shared context (a passage asked about many times, one system text on every row)
    made different questions MinHash-alike: near_duplicate at 0.91. A row is judged on its last
    question, under the same instructions and earlier turns."""
    store = Warehouse(tmp_path / "warehouse")
    read, ack = f"Read this passage:\n\n{PASSAGE}", "I have read it. Ask your question."
    system = f"You are a patient tutor. {PASSAGE}"
    rows = [
        seed_row("q0", LED, turns=[read, ack]),
        seed_row("q1", "When did it begin to decline?", turns=[read, ack], line=2),
        seed_row("q2", "Name two goods traded through the Kontors.", turns=[read, ack], line=3),
        seed_row("q3", LED.upper(), turns=[read, ack], line=4),  # a repeat
        seed_row("q4", f"So {LED}", turns=[read, ack], line=5),  # alike
        seed_row("q5", LED, line=6),  # asked without the passage: another example
        seed_row("s0", "What is 17 times 23?", instructions=system, line=7),
        seed_row("s1", "Is 91 a prime number?", instructions=system, line=8),
        seed_row("s2", "Solve x + 5 = 12 for x.", instructions=system, line=9),
    ]
    store.write_partition("seeds", "2026-12-01", "night", rows)
    inputs = DistillInputs(seeds=seeds_from_rows(rows))
    with _gate(tmp_path).partition(store, TASK, inputs, "2026-12-01", "night") as screen:
        kept = [row.input_id for row in screen.admit(_rows(inputs, "night"))]
    assert kept == ["q0", "q1", "q2", "q5", "s0", "s1", "s2"]
    reasons = {row.input_id: row.reason for row in screen.quarantined}
    assert reasons["q3"].startswith("duplicate of input 'q0'")
    assert reasons["q4"].startswith("near_duplicate of input 'q0'")


def test_prompt_and_answer_keys_keep_where_the_question_ends(tmp_path: Path) -> None:
    """Under prompt+answer the exact key joined the two with a space: a word moved from the
    question to the answer made the same key (now alike, not the same)."""
    store = Warehouse(tmp_path / "warehouse")
    asked = "Complete the sentence about the city that is the capital of France"
    inputs = land_seeds_of(store, "2026-12-01", "night", [f"{asked} is", asked])
    first, second = _rows(inputs, "night")
    rows = [
        first.model_copy(update={"response": "Paris."}),
        second.model_copy(update={"response": "is Paris."}),
    ]
    gate = _gate(tmp_path, dedup_fields="prompt+answer")
    with gate.partition(store, TASK, inputs, "2026-12-01", "night") as screen:
        assert [row.input_id for row in screen.admit(rows)] == ["night-0"]
    assert screen.quarantined[0].reason.startswith("near_duplicate of input 'night-0'")


def test_a_variant_that_repeats_its_seed_is_a_near_duplicate_of_it(tmp_path: Path) -> None:
    store = Warehouse(tmp_path / "warehouse")
    inputs = land_seeds_of(store, "2026-12-01", "night", [PROMPT])
    close, other = amplified(2)
    variants = [
        close.model_copy(update={"seed_id": "night-0", "prompt": PROMPT + " Make it sad."}),
        other.model_copy(update={"seed_id": "night-0", "prompt": "Describe a lighthouse."}),
    ]
    inputs = DistillInputs(seeds=inputs.seeds, variants=variants)
    with _gate(tmp_path).partition(store, TASK, inputs, "2026-12-01", "night") as screen:
        kept = [(row.origin, row.input_id) for row in screen.admit(_rows(inputs, "night"))]
    # The seed's answer lands first and stays; a variant that says the same is set aside.
    assert kept == [("seed", "night-0"), ("variant", other.request_id)]
    assert screen.quarantined[0].reason.startswith("near_duplicate of input 'night-0'")


def test_prompt_and_answer_keeps_two_different_answers_to_one_prompt(tmp_path: Path) -> None:
    store = Warehouse(tmp_path / "warehouse")
    inputs = land_seeds_of(store, "2026-12-01", "night", [PROMPT, PROMPT, PROMPT])
    first, second, third = _rows(inputs, "night")
    rows = [
        first.model_copy(update={"response": "The keeper reads the note by lamplight and weeps."}),
        second.model_copy(update={"response": "A storm breaks the bottle before anyone reads it."}),
        third.model_copy(update={"response": "The keeper reads the note by lamplight and weeps."}),
    ]
    gate = _gate(tmp_path, dedup_fields="prompt+answer")
    with gate.partition(store, TASK, inputs, "2026-12-01", "night") as screen:
        kept = [row.input_id for row in screen.admit(rows)]
    assert kept == ["night-0", "night-1"]


def test_with_dedup_off_and_no_benchmarks_the_gate_screens_nothing(tmp_path: Path) -> None:
    assert not _gate(tmp_path, dedup=False).screens(TASK)
    assert _gate(tmp_path).screens(TASK)


def test_totals_count_the_gate_s_rows_not_the_reader_s_duplicate_ids(tmp_path: Path) -> None:
    store = Warehouse(tmp_path / "warehouse")
    reader, gate_rows = quarantined(2)
    store.write_partition(
        "quarantine",
        "2026-12-01",
        "night",
        [
            reader.model_copy(update={"stage": "input", "reason": "duplicate input id 'a'"}),
            gate_rows.model_copy(update={"stage": "distill", "reason": "near_duplicate of x"}),
        ],
    )
    assert set_aside_totals(store) == {"duplicate": 0, "near_duplicate": 1, "contaminated": 0}
    assert set_aside_totals(Warehouse(tmp_path / "empty" / "warehouse")) == {
        "duplicate": 0,
        "near_duplicate": 0,
        "contaminated": 0,
    }


def test_prompts_apart_by_an_operator_or_symbol_are_all_kept(
    tmp_path: Path, state_backend: StateBackend
) -> None:
    """Math and code prompts: only case and spacing make an exact duplicate."""
    store = Warehouse(tmp_path / "warehouse")
    prompts = [
        "What is 2+2?",
        "What is 2-2?",
        "What is 2*2?",
        "What is 22?",
        "Is 3 < 2?",
        "Is 3 > 2?",
        "Explain C++ templates",
        "Explain C# templates",
        "+-*/",
        "<>=!",
        "what  is 2+2 ?",  # a space more, only that: still not "What is 2+2?"
        "WHAT IS 2+2?",  # case only: the duplicate
    ]
    inputs = land_seeds_of(store, "2026-12-01", "math", prompts)
    gate = QualityGate(QualitySettings(), state_backend.paths.dedup_state)
    with gate.partition(store, TASK, inputs, "2026-12-01", "math") as screen:
        kept = [row.input_id for row in screen.admit(_rows(inputs, "math"))]
    assert kept == [f"math-{n}" for n in range(11)]
    (aside,) = screen.quarantined
    assert aside.input_id == "math-11"
    assert aside.reason.startswith("duplicate of input 'math-0'")


# Written for these tests (no benchmark's text): a word problem and a story request in Japanese.
JAPANESE_ITEM = (
    "ある店でりんごを一個百二十円で売っています。五個買うと、代金は全部でいくらになりますか。"
)
JAPANESE_STORY = (
    "灯台守の女性が、四十年前に海で行方不明になった祖母の船から流された瓶の中の手紙を見つける"
    "短い物語を書いてください。手紙には祖母が最後に見た星空のことと、家族への思いが書かれています。"
    "物語の最後では、彼女が灯台の明かりを祖母のためにともし続ける理由がわかるようにしてください。"
)


def test_japanese_copies_of_a_benchmark_and_near_duplicates_are_caught(
    tmp_path: Path, state_backend: StateBackend
) -> None:
    """Text without spaces is screened by character n-grams (words would be one per sentence)."""
    bench = tmp_path / "jp_eval.jsonl"
    items = [{"id": "jp-1", "question": JAPANESE_ITEM}, {"id": "jp-2", "question": "日本の首都は?"}]
    bench.write_text("".join(json.dumps(item) + "\n" for item in items), encoding="utf-8")
    store = Warehouse(tmp_path / "warehouse")
    prompts = [
        JAPANESE_STORY,
        JAPANESE_STORY + "お願いします。",  # the same request, more politely
        f"次の問題を解いてください。{JAPANESE_ITEM}",
        "日本の首都はどこですか。",  # shares fewer than 13 characters with jp-2
    ]
    inputs = land_seeds_of(store, "2026-12-01", "ja", prompts)
    gate = QualityGate(QualitySettings(benchmarks=(bench,)), state_backend.paths.dedup_state)
    with gate.partition(store, TASK, inputs, "2026-12-01", "ja") as screen:
        kept = [row.input_id for row in screen.admit(_rows(inputs, "ja"))]
    assert kept == ["ja-0", "ja-3"]
    reasons = {row.input_id: row.reason for row in screen.quarantined}
    assert reasons["ja-1"].startswith("near_duplicate of input 'ja-0'")
    assert reasons["ja-2"].startswith(
        "contaminated: the prompt shares 13 words with benchmark jp_eval.jsonl item 'jp-1'"
    )


def test_a_contaminated_row_names_the_item_it_shares_most_with(tmp_path: Path) -> None:
    """Two items open with the same boilerplate; a prompt copying the second names the second."""
    boilerplate = (
        "Read the following passage carefully and then answer the question below using only "
        "information from the passage."
    )
    bench = tmp_path / "reading.jsonl"
    items = [
        {"id": "A", "question": f"{boilerplate} Why did the river flood in the spring?"},
        {
            "id": "B",
            "question": f"{boilerplate} Which two colonies signed the treaty of the northern "
            "harbour, and what did each of them give up in exchange for the fishing rights?",
        },
    ]
    bench.write_text("".join(json.dumps(item) + "\n" for item in items), encoding="utf-8")
    store = Warehouse(tmp_path / "warehouse")
    inputs = land_seeds_of(store, "2026-12-01", "night", [f"Help me: {items[1]['question']}"])
    gate = _gate(tmp_path, benchmarks=(bench,), dedup=False)
    with gate.partition(store, TASK, inputs, "2026-12-01", "night") as screen:
        assert list(screen.admit(_rows(inputs, "night"))) == []
    (aside,) = screen.quarantined
    words = len(str(items[1]["question"]).split())
    assert aside.reason.startswith(
        "contaminated: the prompt shares 13 words with benchmark reading.jsonl item 'B' "
        f"({words - 12} shared 13-grams"
    )


def _land(
    gate: QualityGate, store: Warehouse, partition: tuple[str, str], prompts: list[str], tag: str
) -> tuple[list[str], list[str]]:
    """`prompts` landed and answered through `gate`; (kept input ids, set-aside reasons). `tag`
    makes the answers' request ids (content hashes in production) differ between versions."""
    ds, source = partition
    inputs = land_seeds_of(store, ds, source, prompts)
    rows = [
        row.model_copy(update={"request_id": f"{tag}-{row.request_id}"})
        for row in _rows(inputs, source)
    ]
    with gate.partition(store, TASK, inputs, ds, source) as screen:
        kept = list(screen.admit(rows))
        store.write_partition("distilled", ds, source, kept)
    return [row.input_id for row in kept], [row.reason for row in screen.quarantined]


def test_a_repeat_of_a_row_that_left_is_screened_again_and_kept(
    tmp_path: Path, state_backend: StateBackend
) -> None:
    """The kept original's partition is rebuilt without it (its input changed): the partition
    holding its repeat is marked, and screened again keeps the row."""
    store = Warehouse(tmp_path / "warehouse")
    gate = QualityGate(QualitySettings(), state_backend.paths.dedup_state)
    early, night = ("2026-11-30", "early"), ("2026-12-01", "night")
    assert _land(gate, store, early, [PROMPT], "v1") == (["early-0"], [])
    kept, reasons = _land(gate, store, night, [PROMPT], "v1")
    assert (kept, reasons[0][:30]) == ([], "duplicate of input 'early-0' k")
    _land(gate, store, early, ["How do tides work?"], "v2")
    assert rescreen_partitions(gate.index.location) == [night]
    assert _land(gate, store, night, [PROMPT], "v1") == (["night-0"], [])
    assert rescreen_partitions(gate.index.location) == []


def test_after_a_night_with_the_gate_off_no_row_repeats_a_row_that_is_gone(
    tmp_path: Path, state_backend: StateBackend
) -> None:
    """The original's partition landed again without it while duplicates were off (or written
    past the gate): a later copy is no repeat of a row that no longer exists."""
    store = Warehouse(tmp_path / "warehouse")
    location = state_backend.paths.dedup_state
    gate = QualityGate(QualitySettings(), location)
    early, night = ("2026-11-30", "early"), ("2026-12-01", "night")
    assert _land(gate, store, early, [PROMPT], "v1") == (["early-0"], [])
    assert _land(gate, store, night, [PROMPT], "v1")[0] == []
    benchmarks_only = QualityGate(
        QualitySettings(dedup=False, benchmarks=(benchmark_file(tmp_path),)), location
    )
    _land(benchmarks_only, store, early, ["How do tides work?"], "v2")
    assert _land(gate, store, ("2026-12-02", "later"), [PROMPT], "v1") == (["later-0"], [])
    # Written with no gate at all (the index not told): found gone when a row matches it.
    store.write_partition("distilled", "2026-12-02", "later", [])
    assert _land(gate, store, ("2026-12-03", "last"), [PROMPT], "v1") == (["last-0"], [])
