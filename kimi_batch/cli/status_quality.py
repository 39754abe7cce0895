"""The quality section of `kimi-batch status`: what the quality gate kept out of training over
every partition (duplicates, near-duplicates, contaminated answers), the duplicate index, and the
judge's scores. Read-only like the rest of `status`: only the columns counted are read, the
index is opened read-only, and nothing is created."""

from __future__ import annotations

import polars as pl

from kimi_batch.cli.status_sections import QualitySection
from kimi_batch.pipeline import JudgeTask
from kimi_batch.quality import (
    CONTAMINATED,
    DUPLICATE,
    NEAR_DUPLICATE,
    index_entries,
    set_aside_totals,
)
from kimi_batch.settings import Settings
from kimi_batch.state import StateError
from kimi_batch.storage import StorageError
from kimi_batch.warehouse import open_warehouse

# What the section cannot read and says so (a corrupted index or Parquet file, a folder gone).
_UNREADABLE = (StateError, OSError, StorageError, pl.exceptions.PolarsError)


def quality_section(settings: Settings) -> QualitySection:
    """Totals over every partition, from the warehouse and the duplicate index."""
    benchmarks = [path.name for path in settings.benchmarks]
    try:
        store = open_warehouse(settings)
        totals = set_aside_totals(store)
        scores = store.scan(JudgeTask.table).group_by("score").len().collect().iter_rows()
        indexed = index_entries(settings.paths.dedup_state) or 0
    except _UNREADABLE as error:
        return QualitySection(
            dedup=settings.dedup,
            benchmarks=benchmarks,
            error=f"quality totals are unreadable: {error}",
        )
    judge_scores = {int(score): int(count) for score, count in scores}
    return QualitySection(
        dedup=settings.dedup,
        indexed=indexed,
        duplicates=totals[DUPLICATE],
        near_duplicates=totals[NEAR_DUPLICATE],
        contaminated=totals[CONTAMINATED],
        benchmarks=benchmarks,
        judged=sum(judge_scores.values()),
        judge_scores=judge_scores,
    )
