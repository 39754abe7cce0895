"""Figures the asset checks judge, counted while rows stream to Parquet (nothing held in memory)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

from pydantic import BaseModel, ConfigDict

from kimi_batch.engine import GenerationResult
from kimi_batch.tasks.rows import GenerationColumns

__all__ = ["CheckFigures", "OutputTally"]

RowT = TypeVar("RowT", bound=GenerationColumns)


class CheckFigures(BaseModel):
    """What the checks of one landed partition are judged on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    results: int
    truncated: int
    empty: int
    rows: int
    duplicate_request_ids: int

    @property
    def truncation_rate(self) -> float:
        return self.truncated / self.results if self.results else 0.0


class OutputTally:
    """Counts results (truncated, empty) and rows (duplicate ids) as they pass through."""

    def __init__(self) -> None:
        self._results = self._truncated = self._empty = self._rows = self._duplicates = 0
        self._ids: set[str] = set()

    def results(self, results: Iterable[GenerationResult]) -> Iterator[GenerationResult]:
        for result in results:
            self._results += 1
            self._truncated += result.truncated
            self._empty += not result.text.strip()
            yield result

    def rows(self, rows: Iterable[RowT]) -> Iterator[RowT]:
        for row in rows:
            self._rows += 1
            if row.request_id in self._ids:
                self._duplicates += 1
            self._ids.add(row.request_id)
            yield row

    def figures(self) -> CheckFigures:
        return CheckFigures(
            results=self._results,
            truncated=self._truncated,
            empty=self._empty,
            rows=self._rows,
            duplicate_request_ids=self._duplicates,
        )
