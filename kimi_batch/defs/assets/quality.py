"""The quality gate's checks of a landed partition.

A quality-gated stage's partition (the teacher's answers) lands through `pipeline.screening`; its
materialization then carries the rows set aside as duplicates, near-duplicates and contaminated,
and two checks judge them: `benchmark_contamination` fails above `KIMI_BATCH_CONTAMINATION_MAX_RATE`
(the inputs overlap what the student is evaluated on) and `duplicate_rate` warns when most of a
partition repeats earlier nights (an input dropped again under another name, say). The rows are in
quarantine either way: the checks tell a person, the gate already kept them out.
"""

from __future__ import annotations

import dagster as dg

from kimi_batch.defs.check_states import CONTAMINATION_CHECK, DUPLICATE_CHECK
from kimi_batch.quality import PartitionGate, QualityGate

# Above this share of a partition's rows repeating kept ones, `duplicate_rate` warns.
DUPLICATE_WARN_RATE = 0.5


def quality_checks(screen: PartitionGate | None, gate: QualityGate) -> list[dg.AssetCheckResult]:
    """The partition's contamination and duplicate checks (passed, saying so, when the gate is
    off: every gated stage's partition reports both)."""
    if screen is None:
        off = {"gate": "off (KIMI_BATCH_DEDUP off, no KIMI_BATCH_BENCHMARKS)"}
        return [
            dg.AssetCheckResult(check_name=name, passed=True, metadata=off)
            for name in (CONTAMINATION_CHECK, DUPLICATE_CHECK)
        ]
    counts = screen.counts
    max_rate = gate.settings.contamination_max_rate
    contamination = dg.AssetCheckResult(
        check_name=CONTAMINATION_CHECK,
        passed=counts.contamination_rate <= max_rate,
        metadata={
            "contaminated": counts.contaminated,
            "screened": counts.screened,
            "rate": round(counts.contamination_rate, 4),
            "max_rate": max_rate,
            "benchmarks": ", ".join(screen.benchmark_files) or "none configured",
        },
    )
    duplicates = dg.AssetCheckResult(
        check_name=DUPLICATE_CHECK,
        passed=counts.duplicate_rate <= DUPLICATE_WARN_RATE,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={
            "duplicates": counts.duplicates,
            "near_duplicates": counts.near_duplicates,
            "screened": counts.screened,
            "rate": round(counts.duplicate_rate, 4),
            "warn_rate": DUPLICATE_WARN_RATE,
            "dedup": "on" if screen.dedup else "off",
        },
    )
    return [contamination, duplicates]
