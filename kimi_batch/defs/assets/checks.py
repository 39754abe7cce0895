"""The checks every generation stage's asset declares, and their results for a partition."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import dagster as dg
import polars as pl

from kimi_batch.defs.check_states import CONTAMINATION_CHECK, DUPLICATE_CHECK
from kimi_batch.pipeline import CheckFigures, GenerationTask
from kimi_batch.warehouse import polars_schema

# Above this share of answers cut off at max_tokens the truncation check fails (ERROR): those
# answers are set aside, so most of the night's work would be in quarantine.
TRUNCATION_FAIL_RATE = 0.25


def generation_checks(
    table: str, figures: CheckFigures, written: Mapping[str, pl.DataType]
) -> list[dg.AssetCheckResult]:
    """Duplicate request ids, truncation rate (fails above TRUNCATION_FAIL_RATE), empty outputs
    (set aside included), and schema."""
    expected = polars_schema(table)
    warn = dg.AssetCheckSeverity.WARN
    return [
        dg.AssetCheckResult(
            check_name="no_duplicate_request_ids",
            passed=figures.duplicate_request_ids == 0,
            metadata={"duplicates": figures.duplicate_request_ids},
        ),
        dg.AssetCheckResult(
            check_name="truncation_rate",
            passed=figures.truncation_rate <= TRUNCATION_FAIL_RATE,
            metadata={
                "truncated": figures.truncated,
                "rate": round(figures.truncation_rate, 3),
                "threshold": TRUNCATION_FAIL_RATE,
            },
        ),
        dg.AssetCheckResult(
            check_name="no_empty_outputs",
            passed=figures.empty == 0,
            severity=warn,
            metadata={"empty": figures.empty},
        ),
        dg.AssetCheckResult(
            check_name="matches_table_schema",
            passed=dict(written) == dict(expected),
            metadata={"columns": len(written), "expected_columns": len(expected)},
        ),
    ]


CHECK_NAMES = (
    "no_duplicate_request_ids",
    "truncation_rate",
    "no_empty_outputs",
    "matches_table_schema",
)


def stage_check_names(task: type[GenerationTask[Any, Any]]) -> tuple[str, ...]:
    """The checks a stage's asset declares: every stage's, and the gate's when it is gated."""
    gated = (CONTAMINATION_CHECK, DUPLICATE_CHECK) if task.quality_gated else ()
    return (*CHECK_NAMES, *gated)


def check_specs(
    asset: str,
    partitions_def: dg.PartitionsDefinition,
    names: Sequence[str] = CHECK_NAMES,
) -> list[dg.AssetCheckSpec]:
    """Partitioned like the asset, so each partition's check state is its own (UI, alerts)."""
    with warnings.catch_warnings():
        # Partitioned check specs are a Dagster preview; the warning would print before every
        # CLI command's output (its one-line errors, the demo's progress bars).
        warnings.simplefilter("ignore", dg.PreviewWarning)
        return [
            dg.AssetCheckSpec(name, asset=asset, partitions_def=partitions_def) for name in names
        ]
