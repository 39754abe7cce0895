"""Materialization metadata people can read: rounded to what the figures mean, units in the keys.

Dagster plots numeric metadata over a partition's materializations, so every figure stays a
number; the `summary` entry repeats the latest ones as a small Markdown table for the UI.
"""

from __future__ import annotations

from collections.abc import Mapping

import dagster as dg

from kimi_batch.engine import BatchOutcome

__all__ = ["generation_figures", "summary_table"]


def _r(value: float, digits: int) -> float:
    return round(value, digits)


def generation_figures(outcome: BatchOutcome) -> dict[str, dg.RawMetadataValue]:
    """The engine's figures of one batch: tok/s to 0.1, ms to 1, ratios to 0.001."""
    stats = outcome.stats
    return {
        "requests": stats.total,
        "generated": stats.generated,
        "from_ledger": stats.from_ledger,
        "failures": stats.failed,
        "not_started": stats.not_started,
        "truncated": stats.truncated,
        "completion_tokens": stats.completion_tokens,
        "cached_tokens": stats.cached_tokens,
        "prompt_tokens_per_s": _r(stats.prompt_tokens_per_s, 1),
        "completion_tokens_per_s": _r(stats.completion_tokens_per_s, 1),
        "cache_hit_ratio": _r(stats.cache_hit_ratio, 3),
        "digest_reprefills": stats.digest_reprefills,
        "server_hangs": stats.hangs,
        "latency_p50_ms": _r(stats.latency_p50_ms, 0),
        "latency_p95_ms": _r(stats.latency_p95_ms, 0),
        "max_in_flight": stats.max_in_flight,
        "in_flight_at_start": stats.in_flight_at_start,
        "wall_s": _r(stats.wall_s, 1),
        "digest_sha256": dg.MetadataValue.text(outcome.digest_sha256[:12]),
        "digest_sha256_full": dg.MetadataValue.text(outcome.digest_sha256),
    }


_SUMMARY_KEYS = (
    ("rows", "rows"),
    ("quarantined", "quarantined"),
    ("generated", "generated"),
    ("from_ledger", "from the ledger"),
    ("completion_tokens_per_s", "tok/s"),
    ("cache_hit_ratio", "cache hit"),
    ("latency_p95_ms", "p95 latency (ms)"),
    ("wall_s", "wall (s)"),
)


def summary_table(metadata: Mapping[str, dg.RawMetadataValue]) -> dg.MetadataValue:
    """The headline figures of this materialization as a Markdown table."""
    lines = ["| figure | value |", "| --- | --- |"]
    lines += [f"| {label} | {metadata[key]} |" for key, label in _SUMMARY_KEYS if key in metadata]
    return dg.MetadataValue.md("\n".join(lines))
