"""Batch statistics and progress events (numbers the Dagster UI plots)."""

from __future__ import annotations

import re
import statistics
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.engine.requests import GenerationResult

__all__ = ["BatchStats", "ProgressEvent", "summarize"]

# What `str(ProgressEvent)` writes; alerts read the last such line of a failed run's log back.
_PROGRESS_LINE = re.compile(
    r"(?P<done>\d+)/(?P<total>\d+) rows \((?P<failed>\d+) failed\), "
    r"(?P<tok_s>[\d.]+) tok/s, ETA (?:(?P<eta>[\d.]+) s|\?)"
)


class ProgressEvent(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    done: int
    total: int
    failed: int
    completion_tokens_per_s: float
    elapsed_s: float
    eta_s: float | None
    label: str = Field(
        default="", description="What runs, e.g. 'distilled_responses 2026-11-30|a'."
    )

    def __str__(self) -> str:
        eta = f"{self.eta_s:.0f} s" if self.eta_s is not None else "?"
        return (
            f"{self.done}/{self.total} rows ({self.failed} failed), "
            f"{self.completion_tokens_per_s:.1f} tok/s, ETA {eta}"
        )

    @classmethod
    def from_line(cls, line: str) -> ProgressEvent | None:
        """The event a log line written by `str()` describes (elapsed time is not in it)."""
        found = _PROGRESS_LINE.search(line)
        if found is None:
            return None
        return cls(
            done=int(found["done"]),
            total=int(found["total"]),
            failed=int(found["failed"]),
            completion_tokens_per_s=float(found["tok_s"]),
            elapsed_s=0.0,
            eta_s=float(found["eta"]) if found["eta"] else None,
        )


class BatchStats(BaseModel):
    """Figures of one batch; only requests generated in this run count towards rates."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    total: int = Field(description="Unique requests of the batch.")
    generated: int
    from_ledger: int = Field(description="Finished in an earlier run, not sent again.")
    failed: int
    clamped: int = Field(description="Requests whose max_tokens was cut to the server n_predict.")
    prompt_tokens: int
    cached_tokens: int
    evaluated_tokens: int
    completion_tokens: int
    prompt_tokens_per_s: float = Field(description="Evaluated prompt tokens / prompt time.")
    completion_tokens_per_s: float = Field(description="Generated tokens / wall time.")
    cache_hit_ratio: float = Field(description="min(cached / digest tokens) over the requests.")
    digest_reprefills: int = Field(description="Requests or re-warms that prefilled the digest.")
    max_in_flight: int
    latency_p50_ms: float
    latency_p95_ms: float
    wall_s: float


def _percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def summarize(
    *,
    new_results: Sequence[GenerationResult],
    total: int,
    from_ledger: int,
    failed: int,
    digest_tokens: int,
    digest_reprefills: int,
    max_in_flight: int,
    clamped: int,
    wall_s: float,
) -> BatchStats:
    prompt_ms = sum(r.prompt_ms for r in new_results)
    evaluated = sum(r.prompt_tokens - r.cached_tokens for r in new_results)
    completion = sum(r.completion_tokens for r in new_results)
    latencies = sorted(r.latency_ms for r in new_results)
    ratios = [min(r.cached_tokens / digest_tokens, 1.0) for r in new_results if digest_tokens]
    return BatchStats(
        total=total,
        generated=len(new_results),
        from_ledger=from_ledger,
        failed=failed,
        clamped=clamped,
        prompt_tokens=sum(r.prompt_tokens for r in new_results),
        cached_tokens=sum(r.cached_tokens for r in new_results),
        evaluated_tokens=evaluated,
        completion_tokens=completion,
        prompt_tokens_per_s=evaluated / (prompt_ms / 1000) if prompt_ms > 0 else 0.0,
        completion_tokens_per_s=completion / wall_s if wall_s > 0 else 0.0,
        cache_hit_ratio=min(ratios) if ratios else 1.0,
        digest_reprefills=digest_reprefills,
        max_in_flight=max_in_flight,
        latency_p50_ms=_percentile(latencies, 50),
        latency_p95_ms=_percentile(latencies, 95),
        wall_s=wall_s,
    )
