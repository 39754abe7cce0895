"""Benchmark files as n-gram indexes: JSONL and Parquet, the hit named, bad files refused."""

from __future__ import annotations

import json
import tempfile
import unicodedata
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kimi_batch.errors import ConfigError
from kimi_batch.quality.dedup_index import loose_text
from kimi_batch.quality.gate import BenchmarkIndex, load_benchmarks, word_ngrams

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


def test_russian_keeps_word_ngrams_and_japanese_is_cut_into_characters(tmp_path: Path) -> None:
    russian = (
        "Мальчик купил три яблока и две груши, а потом отдал половину фруктов своей сестре. "  # noqa: RUF001
        "Сколько фруктов у него осталось?"  # noqa: RUF001
    )
    japanese = "りんごを三個とみかんを二個買いました。全部でいくつ買いましたか。"
    bench = _jsonl(
        tmp_path / "multi.jsonl", [{"id": "ru", "q": russian}, {"id": "ja", "q": japanese}]
    )
    index = BenchmarkIndex([bench], 13)
    words = russian.split()
    assert index.ngrams == (len(words) - 12) + (len(loose_text(japanese)) - 12)
    found = index.best_hit(f"Реши задачу: {' '.join(words[:13])}")
    assert found is not None
    assert (found.item_id, found.shared) == ("ru", 1)
    assert index.best_hit(" ".join(words[:12])) is None  # twelve words are no overlap
    copied = index.best_hit(f"Please solve this:{japanese}Thanks")
    assert copied is not None
    assert copied.item_id == "ja"


def test_parquet_benchmarks_index_every_text_field_and_list(tmp_path: Path) -> None:
    path = tmp_path / "mmlu.parquet"
    pl.DataFrame(
        {"id": [1, 2], "question": ["short", "also short"], "choices": [[QUESTION], ["a", "b"]]}
    ).write_parquet(path)
    hit = BenchmarkIndex([path], 13).best_hit(QUESTION)
    assert hit is not None
    assert (hit.benchmark, hit.item_id) == ("mmlu.parquet", "1")


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\x85"])
def test_a_jsonl_line_holding_a_unicode_line_separator_is_one_item(
    tmp_path: Path, separator: str
) -> None:
    # json.dumps(ensure_ascii=False) writes these raw inside a string; only "\n" ends a line.
    items = [{"id": "sep", "q": f"{QUESTION}{separator}Answer in words."}, {"id": "2", "q": "x"}]
    path = tmp_path / "bench.jsonl"
    path.write_bytes(
        "".join(json.dumps(item, ensure_ascii=False) + "\r\n" for item in items).encode("utf-8")
    )
    assert separator.encode("utf-8") in path.read_bytes()
    index = BenchmarkIndex([path], 13)
    hit = index.best_hit(QUESTION)
    assert hit is not None
    assert (hit.benchmark, hit.item_id) == ("bench.jsonl", "sep")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"question": "no id"}\n', "no `id`"),
        (b"not json\n", "not JSON"),
        (b"[1]\n", "JSON object"),
        (b'{"id": "1", "q": "caf\xe9"}\n', "not UTF-8"),  # Latin-1
        (b'{"id": 1' + b"0" * 5000 + b"}\n", "line 1: not JSON"),  # past Python's 4,300 digits
        (b'{"id": "1", "q": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n", "line 1: not JSON"),
    ],
    ids=["no-id", "not-json", "not-object", "latin-1", "huge-int", "deep"],
)
def test_a_bad_benchmark_file_is_a_clear_error(
    tmp_path: Path, content: bytes, message: str
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=message):
        BenchmarkIndex([path], 13)


def test_a_copy_carrying_soft_hyphens_or_zero_width_spaces_is_still_found(tmp_path: Path) -> None:
    """Text pasted from the web carries invisible format characters inside its words."""
    path = _jsonl(tmp_path / "b.jsonl", [{"id": "web", "q": QUESTION}])
    index = BenchmarkIndex([path], 13)
    words = QUESTION.split(" ")
    for mark in ("\u00ad", "\u200b"):
        pasted = " ".join(word[:2] + mark + word[2:] if len(word) > 3 else word for word in words)
        assert pasted != QUESTION
        hit = index.best_hit(pasted)
        assert hit is not None, mark
        assert hit.item_id == "web"


def test_a_benchmark_file_may_start_with_a_byte_order_mark(tmp_path: Path) -> None:
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"id": "bom", "q": QUESTION}).encode() + b"\n")
    hit = BenchmarkIndex([path], 13).best_hit(QUESTION)
    assert hit is not None
    assert hit.item_id == "bom"


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


# Hostile input (hypothesis): what a copy of a benchmark item is found by, in any script.
_KANA_AND_HAN = [
    chr(code)
    for block in (range(0x4E00, 0x4E00 + 3000), range(0x3041, 0x3097), range(0x30A1, 0x30FB))
    for code in block
]
UNSPACED = st.sampled_from(_KANA_AND_HAN)
ANY_TEXT = st.text(
    st.one_of(
        st.characters(exclude_categories=["Cs"]),
        st.sampled_from("aZ09+-*/<>=!? \t\n\x00\x1b\u200d\u3000。、「」дЖภาษา한국"),
    ),
    max_size=30,
)
# What follows a copy may not start with a mark that joins the copy's last character.
AFTER = ANY_TEXT.filter(lambda text: not text or unicodedata.combining(text[0]) == 0).filter(
    lambda text: not text or text[0] not in "\u3099\u309a\uff9e\uff9f"
)


def _overlap(index_n: int, item: str, text: str) -> int:
    grams = set(word_ngrams(loose_text(item), index_n))
    return len(grams & set(word_ngrams(loose_text(text), index_n)))


def _index_of(items: list[str], n: int) -> BenchmarkIndex:
    with tempfile.TemporaryDirectory() as folder:
        path = _jsonl(
            Path(folder) / "bench.jsonl", [{"id": str(i), "q": t} for i, t in enumerate(items)]
        )
        return BenchmarkIndex([path], n)


@settings(max_examples=300, deadline=None)
@given(
    st.text(UNSPACED, min_size=13, max_size=60),
    ANY_TEXT,
    AFTER,
    st.lists(st.text(UNSPACED, max_size=40), max_size=3),
)
def test_a_japanese_or_chinese_item_copied_into_any_text_is_found(
    item: str, before: str, after: str, others: list[str]
) -> None:
    index = _index_of([item, *others], 13)
    text = before + item + after
    hit = index.best_hit(text)
    assert hit is not None
    best = max(_overlap(13, candidate, text) for candidate in [item, *others])
    assert hit.shared == best
    assert _overlap(13, [item, *others][int(hit.item_id)], text) == best


WORDS = st.sampled_from(["a", "b", "c", "d", "x+y", "東", "京", "Жж", "ไทย"])


@settings(max_examples=500, deadline=None)
@given(
    st.lists(st.lists(WORDS, max_size=12).map(" ".join), min_size=1, max_size=6),
    st.lists(WORDS, max_size=24).map(" ".join),
)
def test_the_named_item_is_the_first_with_the_most_shared_ngrams(
    items: list[str], text: str
) -> None:
    index = _index_of(items, 3)
    overlaps = [_overlap(3, item, text) for item in items]
    hit = index.best_hit(text)
    if max(overlaps) == 0:
        assert hit is None
        return
    assert hit is not None
    assert hit.shared == max(overlaps)
    assert int(hit.item_id) == overlaps.index(max(overlaps))  # the first among equals
    assert hit.ngram in set(word_ngrams(loose_text(items[int(hit.item_id)]), 3))
