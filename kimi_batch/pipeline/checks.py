"""The checks every generation stage's partition is judged by, no Dagster: their names and their
verdicts (the Dagster adapter turns them into asset check results).

`truncation_rate` fails above `TRUNCATION_FAIL_RATE` (those answers are set aside, so most of the
work would be in quarantine). A quality-gated stage's partition (the teacher's answers) carries
two more: `benchmark_contamination` fails above `KIMI_BATCH_CONTAMINATION_MAX_RATE` (the inputs
overlap what the student is evaluated on) and `duplicate_rate` warns when most of a partition
repeats earlier nights (an input dropped again under another name, say). The rows are in
quarantine either way: the checks tell a person, the gate already kept them out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from kimi_batch.pipeline.generation_task import GenerationTask
from kimi_batch.pipeline.sink import CheckFigures
from kimi_batch.quality import PartitionGate, QualityGate
from kimi_batch.warehouse import polars_schema

TRUNCATION_CHECK = "truncation_rate"
# The quality-gated stages' share of rows sharing an n-gram with a benchmark (fails above the
# configured rate), and of rows repeating kept ones (warns; not an alert: they are set aside).
CONTAMINATION_CHECK = "benchmark_contamination"
DUPLICATE_CHECK = "duplicate_rate"
CHECK_NAMES = (
    "no_duplicate_request_ids",
    TRUNCATION_CHECK,
    "no_empty_outputs",
    "matches_table_schema",
)
# Above this share of answers cut off at max_tokens the truncation check fails (ERROR): those
# answers are set aside, so most of the night's work would be in quarantine.
TRUNCATION_FAIL_RATE = 0.25
# Above this share of a partition's rows repeating kept ones, `duplicate_rate` warns.
DUPLICATE_WARN_RATE = 0.5


@dataclass(frozen=True)
class CheckVerdict:
    """One check of one partition: passed or not, what it saw; `warn`: a warning, not an error."""

    name: str
    passed: bool
    metadata: dict[str, Any] = field(default_factory=dict)
    warn: bool = False


def stage_check_names(task: type[GenerationTask[Any, Any]]) -> tuple[str, ...]:
    """The checks a stage's partition is judged by: every stage's, and the gate's when gated."""
    gated = (CONTAMINATION_CHECK, DUPLICATE_CHECK) if task.quality_gated else ()
    return (*CHECK_NAMES, *gated)


def generation_verdicts(
    table: str, figures: CheckFigures, written: Mapping[str, pl.DataType]
) -> list[CheckVerdict]:
    """Duplicate request ids, truncation rate (fails above TRUNCATION_FAIL_RATE), empty outputs
    (set aside included), and schema."""
    expected = polars_schema(table)
    return [
        CheckVerdict(
            "no_duplicate_request_ids",
            figures.duplicate_request_ids == 0,
            {"duplicates": figures.duplicate_request_ids},
        ),
        CheckVerdict(
            TRUNCATION_CHECK,
            figures.truncation_rate <= TRUNCATION_FAIL_RATE,
            {
                "truncated": figures.truncated,
                "rate": round(figures.truncation_rate, 3),
                "threshold": TRUNCATION_FAIL_RATE,
            },
        ),
        CheckVerdict("no_empty_outputs", figures.empty == 0, {"empty": figures.empty}, warn=True),
        CheckVerdict(
            "matches_table_schema",
            dict(written) == dict(expected),
            {"columns": len(written), "expected_columns": len(expected)},
        ),
    ]


def quality_verdicts(screen: PartitionGate | None, gate: QualityGate) -> list[CheckVerdict]:
    """The partition's contamination and duplicate checks (passed, saying so, when the gate is
    off: every gated stage's partition reports both)."""
    if screen is None:
        off = {"gate": "off (KIMI_BATCH_DEDUP off, no KIMI_BATCH_BENCHMARKS)"}
        return [
            CheckVerdict(name, True, dict(off)) for name in (CONTAMINATION_CHECK, DUPLICATE_CHECK)
        ]
    counts = screen.counts
    max_rate = gate.settings.contamination_max_rate
    contamination = CheckVerdict(
        CONTAMINATION_CHECK,
        counts.contamination_rate <= max_rate,
        {
            "contaminated": counts.contaminated,
            "screened": counts.screened,
            "rate": round(counts.contamination_rate, 4),
            "max_rate": max_rate,
            "benchmarks": ", ".join(screen.benchmark_files) or "none configured",
        },
    )
    duplicates = CheckVerdict(
        DUPLICATE_CHECK,
        counts.duplicate_rate <= DUPLICATE_WARN_RATE,
        {
            "duplicates": counts.duplicates,
            "near_duplicates": counts.near_duplicates,
            "screened": counts.screened,
            "rate": round(counts.duplicate_rate, 4),
            "warn_rate": DUPLICATE_WARN_RATE,
            "dedup": "on" if screen.dedup else "off",
        },
        warn=True,
    )
    return [contamination, duplicates]
