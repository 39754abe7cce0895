"""The quality gate of a stage's landing: benchmark contamination, then duplicates across nights.

`QualityGate.partition(ds, source, ...)` screens one partition's rows as they stream to its
Parquet: a row sharing an n-gram with a benchmark item is set aside as `contaminated`, then a row
repeating one already kept (exactly, or MinHash-alike above the threshold) as `duplicate` or
`near_duplicate`; the rest go on, and are indexed when the block ends. The gate applies to the
stages that say so (`GenerationTask.quality_gated`: the teacher's answers), not to API batches,
whose callers asked for every line.

The duplicate index (`storage.dedup_index`) lives at `home/quality/dedup.sqlite3`. When it is
new, or its signature setting changed, it is first rebuilt from the table's landed partitions
(every row there counts as kept), so an install that had answers before the gate does not let
their repeats in.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Protocol, TypeVar, cast

import polars as pl
from pydantic import BaseModel, ConfigDict

from kimi_batch.settings import QualitySettings
from kimi_batch.storage.contamination import BenchmarkIndex, load_benchmarks
from kimi_batch.storage.dedup_index import (
    DedupIndex,
    DuplicateMatch,
    IndexedText,
    PartitionDedup,
)
from kimi_batch.storage.parquet import Warehouse
from kimi_batch.tasks.amplify import normalize_text
from kimi_batch.tasks.quarantine import truncate_raw
from kimi_batch.tasks.rows import GenerationColumns, QuarantineRow

__all__ = [
    "CONTAMINATED",
    "DUPLICATE",
    "NEAR_DUPLICATE",
    "GateCounts",
    "GatedRow",
    "PartitionGate",
    "QualityGate",
]

DUPLICATE = "duplicate"
NEAR_DUPLICATE = "near_duplicate"
CONTAMINATED = "contaminated"

RowT = TypeVar("RowT", bound=GenerationColumns)


class GatedRow(Protocol):
    """What the gate reads of a row (a distilled answer)."""

    @property
    def request_id(self) -> str: ...
    @property
    def input_id(self) -> str: ...
    @property
    def prompt(self) -> str: ...
    @property
    def response(self) -> str: ...


class GateCounts(BaseModel):
    """One partition's screening: rows seen and set aside by reason."""

    model_config = ConfigDict(extra="forbid")

    screened: int = 0
    duplicates: int = 0
    near_duplicates: int = 0
    contaminated: int = 0

    @property
    def contamination_rate(self) -> float:
        return self.contaminated / self.screened if self.screened else 0.0


def _dedup_text(row: GatedRow, fields: str) -> str:
    prompt = normalize_text(row.prompt)
    return f"{prompt} {normalize_text(row.response)}" if fields == "prompt+answer" else prompt


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
        source: str,
        fields: str,
        dedup: PartitionDedup | None,
        benchmarks: BenchmarkIndex | None,
    ) -> None:
        self._stage, self._source, self._fields = stage, source, fields
        self._dedup, self._benchmarks = dedup, benchmarks
        self.counts = GateCounts()
        self.quarantined: list[QuarantineRow] = []
        self.benchmark_files: list[str] = benchmarks.names if benchmarks else []

    def admit(self, rows: Iterable[RowT]) -> Iterator[RowT]:
        """The rows that pass, in order; the others become `quarantined` rows."""
        for row in rows:
            self.counts.screened += 1
            reason = self._reason(cast(GatedRow, row))
            if reason is None:
                yield row
                continue
            self.quarantined.append(self._set_aside(row, reason))

    def _reason(self, row: GatedRow) -> str | None:
        if self._benchmarks is not None:
            for text in (row.prompt, row.response):
                hit = self._benchmarks.first_hit(normalize_text(text))
                if hit is not None:
                    self.counts.contaminated += 1
                    return (
                        f"{CONTAMINATED}: shares {self._benchmarks.n} words with benchmark "
                        f"{hit.benchmark} item {hit.item_id!r}: {hit.ngram!r}"
                    )
        if self._dedup is None:
            return None
        match = self._dedup.check(
            IndexedText(
                request_id=row.request_id,
                input_id=row.input_id,
                text=_dedup_text(row, self._fields),
            )
        )
        if match is None:
            return None
        if match.kind == "duplicate":
            self.counts.duplicates += 1
        else:
            self.counts.near_duplicates += 1
        return _duplicate_reason(match)

    def _set_aside(self, row: GenerationColumns, reason: str) -> QuarantineRow:
        prompt = getattr(row, "prompt", "")
        return QuarantineRow(
            request_id=row.request_id,
            input_id=row.input_id,
            model=row.model,
            digest_sha256=row.digest_sha256,
            prompt_tokens=row.prompt_tokens,
            cached_tokens=row.cached_tokens,
            completion_tokens=row.completion_tokens,
            finish_reason=row.finish_reason,
            stage=self._stage,
            source_file=self._source,
            line=None,
            reason=reason,
            raw=truncate_raw(prompt),
            created_at=row.created_at,  # the row's own time: a rerun yields identical rows
            input_sha256=row.input_sha256 or None,
        )

    def metadata(self) -> dict[str, float]:
        """The partition's screening figures for its materialization."""
        figures: dict[str, float] = {}
        if self._dedup is not None:
            figures["duplicates"] = self.counts.duplicates
            figures["near_duplicates"] = self.counts.near_duplicates
        if self._benchmarks is not None:
            figures["contaminated"] = self.counts.contaminated
            figures["contamination_rate"] = round(self.counts.contamination_rate, 4)
        return figures


class QualityGate:
    """The gate of one deployment: its settings, its index file, its benchmarks."""

    def __init__(self, settings: QualitySettings, index_path: Path) -> None:
        self.settings = settings
        self.index = DedupIndex(
            index_path,
            threshold=settings.dedup_threshold,
            shingle=settings.dedup_shingle,
            fields=settings.dedup_fields,
        )

    @property
    def active(self) -> bool:
        return self.settings.dedup or bool(self.settings.benchmarks)

    def _rebuild_from(self, store: Warehouse, table: str, ds: str, source: str) -> None:
        fields = self.settings.dedup_fields

        def rows(frame: pl.DataFrame) -> Iterator[IndexedText]:
            for record in frame.select("request_id", "input_id", "prompt", "response").iter_rows(
                named=True
            ):
                text = normalize_text(record["prompt"])
                if fields == "prompt+answer":
                    text = f"{text} {normalize_text(record['response'])}"
                yield IndexedText(
                    request_id=record["request_id"], input_id=record["input_id"], text=text
                )

        landed = [p for p in sorted(store.partitions(table)) if p != (ds, source)]
        self.index.rebuild(
            (p_ds, p_source, rows(store.read_partition(table, p_ds, p_source)))
            for p_ds, p_source in landed
        )

    @contextmanager
    def partition(
        self, store: Warehouse, table: str, stage: str, ds: str, source: str
    ) -> Iterator[PartitionGate]:
        """Screen partition (ds, source) of `table`; its kept rows are indexed when the block
        ends without an error (the caller writes them inside it)."""
        benchmarks = load_benchmarks(
            self.settings.benchmarks, self.settings.contamination_ngram
        )
        with ExitStack() as stack:
            dedup = None
            if self.settings.dedup:
                if self.index.needs_rebuild():
                    self._rebuild_from(store, table, ds, source)
                dedup = stack.enter_context(self.index.partition(ds, source))
            yield PartitionGate(
                stage=stage,
                source=source,
                fields=self.settings.dedup_fields,
                dedup=dedup,
                benchmarks=benchmarks,
            )
