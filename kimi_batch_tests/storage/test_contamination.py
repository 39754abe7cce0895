"""Benchmark files as n-gram indexes: JSONL and Parquet, the hit named, bad files refused."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from kimi_batch.errors import ConfigError
from kimi_batch.storage.contamination import BenchmarkIndex, load_benchmarks, word_ngrams
from kimi_batch.tasks.text_keys import loose_text

QUESTION = (
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips "
    "in May. How many clips did Natalia sell altogether?"
)


def _jsonl(path: Path, items: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(item) + "\n" for item in items), encoding="utf-8")
    return path


def test_word_ngrams_need_n_words() -> None:
    assert list(word_ngrams("a b c", 2)) == ["a b", "b c"]
    assert list(word_ngrams("a b", 3)) == []


def test_a_text_sharing_13_words_names_the_benchmark_item_and_the_ngram(tmp_path: Path) -> None:
    bench = _jsonl(tmp_path / "gsm8k.jsonl", [{"id": "q-7", "question": QUESTION, "n": 1}])
    index = BenchmarkIndex([bench], 13)
    quoted = f"Please solve: {QUESTION.upper()} Show your work."
    hit = index.best_hit(quoted)
    assert hit is not None
    assert (hit.benchmark, hit.item_id) == ("gsm8k.jsonl", "q-7")
    assert len(hit.ngram.split()) == 13
    assert hit.ngram in loose_text(QUESTION)
    assert hit.shared == len(loose_text(QUESTION).split()) - 12  # every 13-gram of the item
    # Twelve shared words are not an overlap.
    twelve = " ".join(loose_text(QUESTION).split()[:12])
    assert index.best_hit(f"unrelated start {twelve} unrelated end") is None


def test_parquet_benchmarks_index_every_text_field_and_list(tmp_path: Path) -> None:
    path = tmp_path / "mmlu.parquet"
    pl.DataFrame(
        {"id": [1, 2], "question": ["short", "also short"], "choices": [[QUESTION], ["a", "b"]]}
    ).write_parquet(path)
    hit = BenchmarkIndex([path], 13).best_hit(QUESTION)
    assert hit is not None
    assert (hit.benchmark, hit.item_id) == ("mmlu.parquet", "1")


@pytest.mark.parametrize(
    ("content", "message"),
    [('{"question": "no id"}\n', "no `id`"), ("not json\n", "not JSON"), ("[1]\n", "JSON object")],
)
def test_a_bad_benchmark_file_is_a_clear_error(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ConfigError, match=message):
        BenchmarkIndex([path], 13)


def test_loaded_indexes_are_reused_until_a_file_changes(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "b.jsonl", [{"id": "1", "q": QUESTION}])
    assert load_benchmarks([], 13) is None
    first = load_benchmarks([path], 13)
    assert load_benchmarks([path], 13) is first
    _jsonl(path, [{"id": "2", "q": QUESTION + " and more words here"}])
    changed = load_benchmarks([path], 13)
    assert changed is not None
    assert changed is not first
    with pytest.raises(ConfigError, match="benchmark file"):
        load_benchmarks([tmp_path / "missing.jsonl"], 13)
