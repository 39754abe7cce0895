"""Benchmark decontamination: the n-grams of every benchmark item, and the first one a text shares.

A benchmark file (`KIMI_BATCH_BENCHMARKS`) is JSONL or Parquet, one item per line or row: an `id`
and text fields; every string field but `id` is indexed, and every string of a list field (the
choices of a multiple-choice item). Texts are normalized as the duplicate
check normalizes them (casefolded, punctuation-free, whitespace-collapsed) and cut into word
n-grams (13 by default, as lm-eval's decontamination). Loaded indexes are kept per process, keyed
by the files' paths, sizes and modification times, so a night loads them once.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from threading import Lock

import polars as pl
from pydantic import BaseModel, ConfigDict

from kimi_batch.errors import ConfigError
from kimi_batch.tasks.amplify import normalize_text

__all__ = ["BenchmarkHit", "BenchmarkIndex", "load_benchmarks", "word_ngrams"]


class BenchmarkHit(BaseModel):
    """A text shares `ngram` with item `item_id` of benchmark file `benchmark`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    benchmark: str
    item_id: str
    ngram: str


def word_ngrams(normalized: str, n: int) -> Iterator[str]:
    """The word n-grams of already-normalized text (none when it has fewer than `n` words)."""
    words = normalized.split()
    for start in range(len(words) - n + 1):
        yield " ".join(words[start : start + n])


def _items(path: Path) -> Iterator[tuple[str, list[str]]]:
    """(id, text fields) of each item of a benchmark file."""
    if path.suffix.lower() == ".parquet":
        records = pl.read_parquet(path).to_dicts()
    else:
        records = []
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ConfigError(f"benchmark {path} line {number}: not JSON ({error})") from error
            if not isinstance(record, dict):
                raise ConfigError(f"benchmark {path} line {number}: not a JSON object")
            records.append(record)
    for number, record in enumerate(records, start=1):
        item_id = record.get("id")
        if item_id is None:
            raise ConfigError(f"benchmark {path} item {number}: no `id`")
        yield (
            str(item_id),
            [text for key, value in record.items() if key != "id" for text in _strings(value)],
        )


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [item for item in value if isinstance(item, str)]  # pyright: ignore[reportUnknownVariableType]
    return []


class BenchmarkIndex:
    """Every n-gram of the benchmark items (a 64-bit hash each) → (file name, item id)."""

    def __init__(self, paths: Sequence[Path], n: int) -> None:
        self.n = n
        self.names = [path.name for path in paths]
        self._items: list[tuple[int, str]] = []
        self._grams: dict[int, int] = {}
        for file_index, path in enumerate(paths):
            try:
                items = list(_items(path))
            except OSError as error:
                raise ConfigError(f"benchmark {path}: {error}") from error
            except pl.exceptions.PolarsError as error:
                raise ConfigError(f"benchmark {path}: not readable Parquet ({error})") from error
            for item_id, texts in items:
                item = len(self._items)
                self._items.append((file_index, item_id))
                for text in texts:
                    for gram in word_ngrams(normalize_text(text), n):
                        self._grams.setdefault(hash(gram), item)

    @property
    def ngrams(self) -> int:
        return len(self._grams)

    def first_hit(self, normalized: str) -> BenchmarkHit | None:
        """The first n-gram of already-normalized text that a benchmark item has, else None."""
        for gram in word_ngrams(normalized, self.n):
            item = self._grams.get(hash(gram))
            if item is not None:
                file_index, item_id = self._items[item]
                return BenchmarkHit(benchmark=self.names[file_index], item_id=item_id, ngram=gram)
        return None


_LOADED: dict[tuple[object, ...], BenchmarkIndex] = {}
_LOADING = Lock()


def load_benchmarks(paths: Sequence[Path], n: int) -> BenchmarkIndex | None:
    """The index of `paths` (None when there are none); ConfigError naming a bad file."""
    if not paths:
        return None
    try:
        stamps = tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in paths)
    except OSError as error:
        raise ConfigError(f"benchmark file: {error}") from error
    key = (stamps, n)
    with _LOADING:
        index = _LOADED.get(key)
        if index is None:
            index = BenchmarkIndex(paths, n)
            _LOADED.clear()  # one benchmark set per process: a changed file replaces its index
            _LOADED[key] = index
        return index
