"""The checks every generation stage's asset declares, and their results for a partition
(`pipeline/checks.py` judges them)."""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping, Sequence

import dagster as dg
import polars as pl

from kimi_batch.pipeline import CHECK_NAMES, CheckFigures, CheckVerdict, generation_verdicts


def check_results(verdicts: Iterable[CheckVerdict]) -> list[dg.AssetCheckResult]:
    """The verdicts as Dagster's check results (a `warn` verdict at WARN severity)."""
    return [
        dg.AssetCheckResult(
            check_name=verdict.name,
            passed=verdict.passed,
            metadata=verdict.metadata,
            severity=dg.AssetCheckSeverity.WARN if verdict.warn else dg.AssetCheckSeverity.ERROR,
        )
        for verdict in verdicts
    ]


def generation_checks(
    table: str, figures: CheckFigures, written: Mapping[str, pl.DataType]
) -> list[dg.AssetCheckResult]:
    """Every stage's checks of a partition (`pipeline.generation_verdicts`)."""
    return check_results(generation_verdicts(table, figures, written))


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
