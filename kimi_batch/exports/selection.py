"""Which rows an export holds: the `distilled` partitions of a date range and a source, with
what each answer was asked (its seed) and its judgement.

A Batch API batch's partition (source = the batch id) holds answers a client asked for, not the
night's training data: the training formats leave it out unless `--source` names it or
`--include-batches` asks for every batch's too.
Quarantined rows are never read: `distilled` holds only kept answers (duplicates, contaminated
and cut-off answers went to `quarantine` instead).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import date

from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.errors import ConfigError, MissingInputError
from kimi_batch.pipeline import DistilledRow, JudgedRow, JudgeTask, SeedRow, Verdict
from kimi_batch.warehouse import Warehouse, validate_source

JUDGED_TABLE = JudgeTask.table
# The Batch API store names a batch `batch_<24 hex>`, and the batch's partition after it.
_BATCH_SOURCE = re.compile(r"^batch_[0-9a-f]{24}$")


def is_batch_source(source: str) -> bool:
    """Whether a partition's source is a Batch API batch."""
    return bool(_BATCH_SOURCE.fullmatch(source))


class ExportQuery(BaseModel):
    """The partitions and rows asked for: days `since`..`until` (inclusive), one source, a
    judge score floor."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    since: date | None = None
    until: date | None = None
    source: str | None = None
    min_judge_score: int | None = Field(default=None, ge=1, le=10)
    include_batches: bool = Field(
        default=False, description="Training exports: Batch API batches' partitions too."
    )

    def check(self) -> ExportQuery:
        if self.source is not None:
            validate_source(self.source)
        if self.since and self.until and self.since > self.until:
            raise ConfigError(f"--since {self.since} is after --until {self.until}")
        return self

    def wants(self, ds: str, source: str, *, training: bool) -> bool:
        day = date.fromisoformat(ds)
        if (self.since and day < self.since) or (self.until and day > self.until):
            return False
        if self.source is not None:
            return source == self.source
        return not (training and is_batch_source(source) and not self.include_batches)

    @property
    def single(self) -> bool:
        """One day and one source: the partition named, as `--date D --source S` asks."""
        return self.source is not None and self.since is not None and self.since == self.until

    def describe(self) -> str:
        days = (
            f"ds={self.since}"
            if self.since and self.since == self.until
            else f"ds {self.since or 'any'}..{self.until or 'any'}"
        )
        return f"{days} source={self.source or 'any'}"


def select_partitions(
    warehouse: Warehouse, query: ExportQuery, *, training: bool
) -> list[tuple[str, str]]:
    """The (ds, source) of the distilled partitions asked for, oldest first; none is an error."""
    found = [
        (ds, source)
        for ds, source in warehouse.partitions("distilled")
        if query.wants(ds, source, training=training)
    ]
    if not found:
        raise MissingInputError(f"no distilled partition {query.describe()}")
    if query.min_judge_score is not None and not any(
        warehouse.has_partition(JUDGED_TABLE, ds, source) for ds, source in found
    ):
        raise MissingInputError(
            f"--min-judge-score needs judge scores, and no partition of {query.describe()} has "
            "been judged: run the judge stage on it first"
        )
    return found


class PartitionRows(BaseModel):
    """One partition's answers (judge floor applied), their seeds by id, their judgements."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ds: str
    source: str
    answers: list[DistilledRow]
    seeds: dict[str, SeedRow]
    judgements: dict[str, Verdict] | None = Field(description="None: never judged.")
    unjudged_dropped: int = 0
    below_floor: int = 0

    def score(self, answer: DistilledRow) -> int | None:
        judgement = (self.judgements or {}).get(answer.request_id)
        return judgement.score if judgement else None


def _rows(warehouse: Warehouse, table: str, ds: str, source: str) -> list[dict[str, object]]:
    return warehouse.read_partition(table, ds, source).drop("ds", "source").to_dicts()


def _judgements(warehouse: Warehouse, ds: str, source: str) -> dict[str, Verdict] | None:
    if not warehouse.has_partition(JUDGED_TABLE, ds, source):
        return None
    rows = [JudgedRow.model_validate(row) for row in _rows(warehouse, JUDGED_TABLE, ds, source)]
    return {row.answer_request_id: Verdict(score=row.score, reason=row.reason) for row in rows}


def _partition(warehouse: Warehouse, query: ExportQuery, ds: str, source: str) -> PartitionRows:
    answers = [
        DistilledRow.model_validate(row) for row in _rows(warehouse, "distilled", ds, source)
    ]
    seeds = [SeedRow.model_validate(row) for row in _rows(warehouse, "seeds", ds, source)]
    judgements = _judgements(warehouse, ds, source)
    unjudged = below = 0
    floor = query.min_judge_score
    if floor is not None:
        scores = judgements or {}
        kept = [
            a for a in answers if a.request_id in scores and scores[a.request_id].score >= floor
        ]
        unjudged = sum(1 for a in answers if a.request_id not in scores)
        below = len(answers) - len(kept) - unjudged
        answers = kept
    return PartitionRows(
        ds=ds,
        source=source,
        answers=answers,
        seeds={seed.input_id: seed for seed in seeds},
        judgements=judgements,
        unjudged_dropped=unjudged,
        below_floor=below,
    )


def read_selection(
    warehouse: Warehouse, query: ExportQuery, partitions: list[tuple[str, str]]
) -> Iterator[PartitionRows]:
    """The partitions' rows one partition at a time: memory holds one partition."""
    for ds, source in partitions:
        yield _partition(warehouse, query, ds, source)
