"""The quality gate of a stage's landing (benchmark contamination, then duplicates across nights)
and its benchmark side: the token n-gram indexes of the benchmark files (`BenchmarkIndex`).

`QualityGate.partition(...)` screens one partition's rows as they stream to its Parquet: a row
sharing an n-gram with a benchmark item is set aside as `contaminated`, then a row repeating one
already kept (its normalized text exactly, or MinHash-alike at the threshold) as `duplicate` or
`near_duplicate`, naming the kept row; the first one stays. The rest go on and are indexed, for
good when the block ends without an error. What a row is judged on is its stage's (`screened`:
the conversation the teacher saw, and its answer). The gate applies to the stages that say so
(`GenerationTask.quality_gated`: the teacher's answers), not to Batch API batches, whose callers
asked for every line, nor to the judge's verdicts.

The duplicate index (`dedup_index`) lives at `home/quality/dedup.sqlite3`, or in the
shared PostgreSQL database with the rest of the state (`StatePaths.dedup_state`). When it is new,
or its signature setting changed, the first partition screened rebuilds it from the stage's
landed partitions (every row there counts as kept), so an install that had answers before the
gate, or a changed shingle size, does not let their repeats in.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from threading import Lock
from typing import TYPE_CHECKING, Any, TypeVar

import polars as pl
from pydantic import BaseModel, ConfigDict

from kimi_batch.errors import ConfigError
from kimi_batch.paths import StateLocation
from kimi_batch.pipeline import (
    INPUT_STAGE,
    GenerationColumns,
    GenerationTask,
    QuarantineRow,
    ScreenedText,
    set_aside_row,
)
from kimi_batch.quality.dedup_index import (
    Alive,
    DedupIndex,
    DedupSetting,
    DuplicateMatch,
    IndexedText,
    KeptEntry,
    PartitionDedup,
    loose_text,
    normalize_text,
    token_ngrams,
)
from kimi_batch.settings import QualitySettings

if TYPE_CHECKING:
    from kimi_batch.warehouse import Warehouse

# ---- the benchmarks -----------------------------------------------------------------------------

# A benchmark file (`KIMI_BATCH_BENCHMARKS`) is JSONL or Parquet, one item per line or row: an
# `id` and text fields; every string field but `id` is indexed, and every string of a list field
# (the choices of a multiple-choice item). Texts are loosely normalized (`dedup_index.loose_text`:
# casefolded, punctuation-free, whitespace-collapsed) and cut into token n-grams (13 by default,
# as lm-eval's decontamination): whitespace words, and single characters in scripts written
# without spaces (a Japanese or Chinese text is screened by character 13-grams). A text
# overlapping several items is reported against the one it shares the most n-grams with (a shared
# boilerplate prefix does not name the wrong item). Loaded indexes are kept per process, keyed by
# the files' paths, sizes and modification times, so a night loads them once.


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


# ---- the gate -----------------------------------------------------------------------------------

DUPLICATE = "duplicate"
NEAR_DUPLICATE = "near_duplicate"
CONTAMINATED = "contaminated"

RowT = TypeVar("RowT", bound=GenerationColumns)
Task = GenerationTask[Any, Any]


class GateCounts(BaseModel):
    """One partition's screening: rows seen, and set aside by reason."""

    model_config = ConfigDict(extra="forbid")

    screened: int = 0
    duplicates: int = 0
    near_duplicates: int = 0
    contaminated: int = 0

    @property
    def contamination_rate(self) -> float:
        return self.contaminated / self.screened if self.screened else 0.0

    @property
    def duplicate_rate(self) -> float:
        repeated = self.duplicates + self.near_duplicates
        return repeated / self.screened if self.screened else 0.0


def _duplicate_reason(match: DuplicateMatch) -> str:
    kept = match.kept
    return (
        f"{match.kind} of input {kept.input_id!r} kept in {kept.ds}|{kept.source} "
        f"(request {kept.request_id[:12]}, similarity {match.similarity:.2f})"
    )


class PartitionGate:
    """One partition's screening (from `QualityGate.partition`)."""

    def __init__(
        self,
        *,
        stage: str,
        screened: Callable[[Any], ScreenedText],
        fields: str,
        dedup: PartitionDedup | None,
        benchmarks: BenchmarkIndex | None,
    ) -> None:
        self._stage, self._screened, self._fields = stage, screened, fields
        self._dedup, self._benchmarks = dedup, benchmarks
        self.counts = GateCounts()
        self.quarantined: list[QuarantineRow] = []

    @property
    def dedup(self) -> bool:
        return self._dedup is not None

    @property
    def benchmark_files(self) -> list[str]:
        return self._benchmarks.names if self._benchmarks else []

    def admit(self, rows: Iterable[RowT]) -> Iterator[RowT]:
        """The rows that pass, in order; the others become `quarantined` rows."""
        for row in rows:
            self.counts.screened += 1
            text = self._screened(row)
            set_aside = self._contamination(text) or self._repeat(row, text)
            if set_aside is None:
                yield row
                continue
            reason, raw = set_aside
            self.quarantined.append(
                set_aside_row(
                    row,
                    stage=self._stage,
                    source_file=text.source_file,
                    line=text.line,
                    reason=reason,
                    raw=raw,
                    input_sha256=row.input_sha256 or None,
                )
            )

    def _contamination(self, text: ScreenedText) -> tuple[str, str] | None:
        """(reason, the text that shares it) naming the benchmark item a row overlaps most."""
        if self._benchmarks is None:
            return None
        for where, said in (("prompt", text.prompt), ("answer", text.answer)):
            hit = self._benchmarks.best_hit(said)
            if hit is not None:
                self.counts.contaminated += 1
                n = self._benchmarks.n
                reason = (
                    f"{CONTAMINATED}: the {where} shares {n} words with benchmark "
                    f"{hit.benchmark} item {hit.item_id!r} ({hit.shared} shared {n}-grams, "
                    f"the first {hit.ngram!r})"
                )
                return reason, said
        return None

    def _repeat(self, row: GenerationColumns, text: ScreenedText) -> tuple[str, str] | None:
        if self._dedup is None:
            return None
        match = self._dedup.check(indexed_text(row, text, self._fields))
        if match is None:
            return None
        if match.kind == DUPLICATE:
            self.counts.duplicates += 1
        else:
            self.counts.near_duplicates += 1
        return _duplicate_reason(match), text.prompt

    def metadata(self) -> dict[str, float]:
        """The partition's screening figures for its materialization."""
        figures: dict[str, float] = {}
        if self._dedup is not None:
            figures["duplicates"] = self.counts.duplicates
            figures["near_duplicates"] = self.counts.near_duplicates
            if self._dedup.rebuilt is not None:
                figures["dedup_index_rebuilt_rows"] = self._dedup.rebuilt
        if self._benchmarks is not None:
            figures["contaminated"] = self.counts.contaminated
            figures["contamination_rate"] = round(self.counts.contamination_rate, 4)
        return figures


def indexed_text(row: GenerationColumns, text: ScreenedText, fields: str) -> IndexedText:
    """What a row's duplicates are found by, normalized: its question under its context (the
    tools offered included), and its answer (its tool calls included) too under
    `KIMI_BATCH_DEDUP_FIELDS=prompt+answer`."""
    question = text.prompt if text.question is None else text.question
    answered = fields == "prompt+answer"
    # Each part on its own: where one turn ends is part of what two contexts share.
    context: list[str | dict[str, str]] = [normalize_text(part) for part in text.context]
    if text.tools is not None:
        # An object, where every other part is a string: no context of turns is one with
        # tools. Added only when offered: a row without tools keeps the key indexed before.
        context.append({"tools": normalize_text(text.tools)})
    return IndexedText(
        request_id=row.request_id,
        input_id=row.input_id,
        text=normalize_text(question),
        answer=normalize_text(text.answer) if answered else None,
        calls=tuple(normalize_text(call) for call in text.tool_calls) if answered else (),
        context=json.dumps(context, ensure_ascii=False),
    )


class QualityGate:
    """The gate of one deployment: its settings, its index file, its benchmarks."""

    def __init__(self, settings: QualitySettings, index: StateLocation) -> None:
        self.settings = settings
        self.index = DedupIndex(
            index,
            DedupSetting(
                threshold=settings.dedup_threshold,
                shingle=settings.dedup_shingle,
                fields=settings.dedup_fields,
            ),
        )

    def screens(self, task: Task) -> bool:
        """Whether `task`'s rows pass the gate here: a gated stage, and a gate switched on."""
        return task.quality_gated and (self.settings.dedup or bool(self.settings.benchmarks))

    def _landed(self, store: Warehouse, task: Task) -> Iterator[tuple[str, str, Iterator[Any]]]:
        """Every landed partition of `task`'s table as the index takes it (a rebuild); each
        read only when the index asks for its rows."""
        for ds, source in store.partitions(task.table):
            yield ds, source, self._indexed(store, task, ds, source)

    def _indexed(self, store: Warehouse, task: Task, ds: str, source: str) -> Iterator[IndexedText]:
        inputs = task.load(lambda table, model: store.read_rows(table, ds, source, model))
        for row in store.read_rows(task.table, ds, source, task.row_model):
            yield indexed_text(row, task.screened(row, inputs), self.settings.dedup_fields)

    @contextmanager
    def partition(
        self,
        store: Warehouse,
        task: Task,
        inputs: Any,
        ds: str,
        source: str,
        *,
        guard: Callable[[], None] | None = None,
    ) -> Iterator[PartitionGate]:
        """Screen partition (ds, source) of `task`'s table (its `inputs` say what each row was
        asked); its kept rows are indexed when the block ends without an error and `guard`
        (the partition's lease) passes. The caller writes the rows inside the block."""
        settings = self.settings
        benchmarks = load_benchmarks(settings.benchmarks, settings.contamination_ngram)
        if not settings.dedup:
            yield self._gate(task, inputs, None, benchmarks)
            self.release(ds, source)
            return
        rebuild = lambda: self._landed(store, task)  # noqa: E731
        alive = _alive_in(store, task.table)
        with self.index.partition(ds, source, rebuild=rebuild, guard=guard, alive=alive) as dedup:
            yield self._gate(task, inputs, dedup, benchmarks)

    def release(self, ds: str, source: str) -> None:
        """Partition (ds, source) of a gated stage landed unscreened (duplicates off): an index
        made on other nights forgets what it held of it, and the repeats of those rows are
        marked to be screened again."""
        self.index.release(ds, source)

    def _gate(
        self,
        task: Task,
        inputs: Any,
        dedup: PartitionDedup | None,
        benchmarks: BenchmarkIndex | None,
    ) -> PartitionGate:
        return PartitionGate(
            stage=task.name,
            screened=lambda row: task.screened(row, inputs),
            fields=self.settings.dedup_fields,
            dedup=dedup,
            benchmarks=benchmarks,
        )


def _alive_in(store: Warehouse, table: str) -> Alive:
    """Whether a kept entry's row is still in `table` (each partition's ids read once). The
    index holds one gated stage's rows (`_landed` rebuilds it from that stage's table)."""
    known: dict[tuple[str, str], frozenset[str]] = {}

    def alive(entry: KeptEntry) -> bool:
        key = (entry.ds, entry.source)
        if key not in known:
            ids = store.read_partition(table, entry.ds, entry.source).get_column("request_id")
            known[key] = frozenset(str(value) for value in ids.drop_nulls())
        return entry.request_id in known[key]

    return alive


def set_aside_totals(store: Warehouse) -> dict[str, int]:
    """Rows the gate set aside in every partition, by kind (`duplicate`, `near_duplicate`,
    `contaminated`): the quarantine's output rows by their reason's first word (an input row
    with a repeated id is the reader's `duplicate input id`, not the gate's)."""
    kind = pl.col("reason").str.extract(r"^([a-z_]+)", 1)
    found = dict(
        store.scan("quarantine")
        .filter(pl.col("stage") != INPUT_STAGE)
        .select(kind.alias("kind"))
        .group_by("kind")
        .len()
        .collect()
        .iter_rows()
    )
    return {name: int(found.get(name, 0)) for name in (DUPLICATE, NEAR_DUPLICATE, CONTAMINATED)}
