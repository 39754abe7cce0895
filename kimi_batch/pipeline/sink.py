"""`StageSink`: where a stage's results go, and the one owner of what they leave behind.

The sink drives the stage's `parse` over the results as they stream from the ledger, passes the
rows on (to the Parquet writer), and keeps everything else itself: the quarantine rows (outputs
set aside, requests that failed) and the figures the asset checks judge. Nothing is held but
those: the rows are never collected.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import Generic, TypeVar

from pydantic import BaseModel, ConfigDict

from kimi_batch.engine import FailedRequest, GenerationResult
from kimi_batch.pipeline.generation_task import GenerationTask, SetAside
from kimi_batch.pipeline.quarantine import failure_rows, result_row
from kimi_batch.pipeline.rows import GenerationColumns, QuarantineRow

InputsT = TypeVar("InputsT")
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


class StageSink(Generic[InputsT, RowT]):
    """One stage run's results in, rows out; quarantine rows and figures kept here."""

    def __init__(
        self, task: GenerationTask[InputsT, RowT], inputs: InputsT, *, input_sha256: str = ""
    ) -> None:
        self._task = task
        self._inputs = inputs
        # The landed input version the inputs were built from: every row and set-aside carries it.
        self._input_sha256 = input_sha256
        self._quarantined: list[QuarantineRow] = []
        self._results = self._truncated = self._empty = 0
        self._parsed = self._rows = self._duplicates = 0
        self._ids: set[str] = set()
        self._sums: Counter[str] = Counter()

    def rows(self, results: Iterable[GenerationResult]) -> Iterator[RowT]:
        """The stage's rows of `results`, one at a time; set-asides stay in the sink."""
        for row in self._task.keep(
            self._parse(self._task.order(self._count(results))), self._inputs
        ):
            self._rows += 1
            self._duplicates += row.request_id in self._ids
            self._ids.add(row.request_id)
            self._sums.update(self._task.measure(row))
            yield row.model_copy(update={"input_sha256": self._input_sha256})

    def _count(self, results: Iterable[GenerationResult]) -> Iterator[GenerationResult]:
        for result in results:
            self._results += 1
            self._truncated += result.truncated
            self._empty += result.empty
            yield result

    def _parse(self, results: Iterable[GenerationResult]) -> Iterator[RowT]:
        for result in results:
            parsed = self._task.parse(result, self._inputs)
            if isinstance(parsed, SetAside):
                self._quarantined.append(
                    result_row(
                        result,
                        stage=self._task.name,
                        source_file=parsed.source_file,
                        line=parsed.line,
                        reason=parsed.reason,
                    )
                )
                continue
            self._parsed += 1
            yield parsed

    def failed(
        self,
        failures: Sequence[FailedRequest],
        *,
        source_file: str,
        model: str,
        digest_sha: str,
        created_at: datetime,
    ) -> None:
        """Requests that failed after every attempt, as quarantine rows (a rerun retries them)."""
        self._quarantined.extend(
            failure_rows(
                failures,
                stage=self._task.name,
                source_file=source_file,
                model=model,
                digest_sha=digest_sha,
                created_at=created_at,
            )
        )

    @property
    def quarantined(self) -> list[QuarantineRow]:
        """Outputs set aside (in the order they were parsed), then failed requests."""
        sha = self._input_sha256 or None
        return [row.model_copy(update={"input_sha256": sha}) for row in self._quarantined]

    @property
    def dropped(self) -> int:
        """Parsed rows the stage's `keep` left out (e.g. duplicates)."""
        return self._parsed - self._rows

    def figures(self) -> CheckFigures:
        return CheckFigures(
            results=self._results,
            truncated=self._truncated,
            empty=self._empty,
            rows=self._rows,
            duplicate_request_ids=self._duplicates,
        )

    def metadata(self) -> dict[str, float]:
        """The stage's own figures for the materialization (e.g. duplicates dropped, scores)."""
        metric = self._task.dropped_metric
        dropped = {metric: self.dropped} if metric else {}
        return {**dropped, **self._task.summarize(self._sums, self._rows)}
