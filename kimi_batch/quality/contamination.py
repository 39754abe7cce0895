"""Benchmark decontamination: the n-grams of every benchmark item, and the item a text shares most.

A benchmark file (`KIMI_BATCH_BENCHMARKS`) is JSONL or Parquet, one item per line or row: an `id`
and text fields; every string field but `id` is indexed, and every string of a list field (the
choices of a multiple-choice item). Texts are loosely normalized (`tasks.text_keys.loose_text`:
casefolded, punctuation-free, whitespace-collapsed) and cut into token n-grams (13 by default, as
lm-eval's decontamination): whitespace words, and single characters in scripts written without
spaces (a Japanese or Chinese text is screened by character 13-grams). A text overlapping several
items is reported against the one it shares the most n-grams with (a shared boilerplate prefix
does not name the wrong item). Loaded indexes are kept per process, keyed by the files' paths,
sizes and modification times, so a night loads them once.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from threading import Lock

import polars as pl
from pydantic import BaseModel, ConfigDict

from kimi_batch.errors import ConfigError
from kimi_batch.quality.text_keys import loose_text, token_ngrams


class BenchmarkHit(BaseModel):
    """A text shares `shared` n-grams (the first: `ngram`) with item `item_id` of benchmark file
    `benchmark`, the item it shares the most with."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    benchmark: str
    item_id: str
    ngram: str
    shared: int


def word_ngrams(normalized: str, n: int) -> Iterator[str]:
    """The token n-grams of already-normalized text (words; single characters of a script
    without spaces), none when it has fewer than `n` tokens."""
    return token_ngrams(normalized, n)


def _items(path: Path) -> Iterator[tuple[str, list[str]]]:
    """(id, text fields) of each item of a benchmark file."""
    if path.suffix.lower() == ".parquet":
        records = pl.read_parquet(path).to_dicts()
    else:
        records = []
        # JSONL lines end at "\n" only: `splitlines` also cuts at U+2028, U+2029 and U+0085,
        # which `json.dumps(ensure_ascii=False)` leaves raw inside a string.
        try:
            text = path.read_bytes().decode("utf-8-sig")  # a leading BOM, as the inbox takes
        except UnicodeDecodeError as error:
            raise ConfigError(f"benchmark {path}: not UTF-8 ({error})") from error
        for number, raw in enumerate(text.split("\n"), start=1):
            line = raw.removesuffix("\r")
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except (ValueError, RecursionError) as error:  # also: too deep, a 4,300-digit int
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
        # One item per n-gram mostly: a tuple only for the n-grams several items share.
        self._grams: dict[int, int | tuple[int, ...]] = {}
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
                for gram in {hash(g) for text in texts for g in word_ngrams(loose_text(text), n)}:
                    self._add(gram, item)

    def _add(self, gram: int, item: int) -> None:
        held = self._grams.get(gram)
        if held is None:
            self._grams[gram] = item
        elif isinstance(held, int):
            self._grams[gram] = (held, item)
        else:
            self._grams[gram] = (*held, item)

    @property
    def ngrams(self) -> int:
        return len(self._grams)

    def best_hit(self, text: str) -> BenchmarkHit | None:
        """The item sharing the most n-grams with `text` (the first indexed among equals), with
        how many and the first one shared, else None. `text` is normalized here."""
        counts: dict[int, int] = {}
        first: dict[int, str] = {}
        seen: set[int] = set()
        for gram in word_ngrams(loose_text(text), self.n):
            key = hash(gram)
            held = self._grams.get(key)
            if held is None or key in seen:
                continue
            seen.add(key)
            for item in (held,) if isinstance(held, int) else held:
                counts[item] = counts.get(item, 0) + 1
                first.setdefault(item, gram)
        if not counts:
            return None
        best = min(counts, key=lambda item: (-counts[item], item))
        file_index, item_id = self._items[best]
        return BenchmarkHit(
            benchmark=self.names[file_index],
            item_id=item_id,
            ngram=first[best],
            shared=counts[best],
        )


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
