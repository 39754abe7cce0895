"""What each contender reports: throughput, prompt work, latency, cache reuse and memory."""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.engine import GenerationResult
from kimi_batch.llama import GenerationStats

__all__ = ["ContenderReport", "PeakRss", "RequestRecord", "summarize_contender"]


class RequestRecord(BaseModel):
    """One finished request as a contender saw it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    latency_ms: float
    prompt_tokens: int
    cached_tokens: int
    evaluated_tokens: int
    completion_tokens: int
    prompt_ms: float
    predicted_ms: float

    @classmethod
    def from_stats(cls, stats: GenerationStats, latency_ms: float) -> RequestRecord:
        return cls(
            latency_ms=latency_ms,
            prompt_tokens=stats.prompt_tokens,
            cached_tokens=stats.cached_tokens,
            evaluated_tokens=stats.evaluated_tokens,
            completion_tokens=stats.completion_tokens,
            prompt_ms=stats.prompt_ms,
            predicted_ms=stats.predicted_ms,
        )

    @classmethod
    def from_result(cls, result: GenerationResult) -> RequestRecord:
        return cls(
            latency_ms=result.latency_ms,
            prompt_tokens=result.prompt_tokens,
            cached_tokens=result.cached_tokens,
            evaluated_tokens=result.prompt_tokens - result.cached_tokens,
            completion_tokens=result.completion_tokens,
            prompt_ms=result.prompt_ms,
            predicted_ms=result.predicted_ms,
        )


class ContenderReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    requests: int
    wall_s: float = Field(description="Timed part; warm-up excluded unless said otherwise.")
    warmup_s: float = 0.0
    gen_tok_s: float = Field(description="Generated tokens / wall.")
    gen_tok_s_incl_warmup: float
    completion_tokens: int
    prompt_tokens_evaluated: int
    prompt_tok_s: float = Field(
        description="Evaluated prompt tokens / the server's prompt time: per-slot (`plan` takes it)."
    )
    slot_gen_tok_s: float = Field(description="Per-slot generation speed (what `plan` takes).")
    ttft_p50_ms: float = Field(description="Latency minus generation time (non-streamed).")
    ttft_p95_ms: float
    latency_p50_ms: float
    latency_p95_ms: float
    digest_reprefills: int = Field(description="Requests that evaluated the digest again.")
    cache_hit_min: float = Field(description="min over requests of cached / prompt tokens.")
    cache_hit_mean: float
    peak_rss_mb: float = Field(description="Peak RSS of this (the pipeline's) process.")


def _pct(values: Sequence[float], q: int) -> float:
    if not values:
        return 0.0
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def summarize_contender(
    name: str,
    records: Sequence[RequestRecord],
    *,
    wall_s: float,
    digest_tokens: int,
    peak_rss_mb: float,
    warmup_s: float = 0.0,
    reprefills: int | None = None,
) -> ContenderReport:
    completion = sum(r.completion_tokens for r in records)
    evaluated = sum(r.evaluated_tokens for r in records)
    prompt_ms = sum(r.prompt_ms for r in records)
    predicted_ms = sum(r.predicted_ms for r in records)
    ttft = sorted(max(r.latency_ms - r.predicted_ms, 0.0) for r in records)
    latency = sorted(r.latency_ms for r in records)
    hits = [r.cached_tokens / r.prompt_tokens for r in records if r.prompt_tokens]
    if reprefills is None:
        reprefills = sum(1 for r in records if r.cached_tokens < digest_tokens)
    # Per-slot speeds as `plan` models them: each slot spends its time on prompt then output.
    slot_prompt = evaluated / (prompt_ms / 1000) if prompt_ms else 0.0
    return ContenderReport(
        name=name,
        requests=len(records),
        wall_s=wall_s,
        warmup_s=warmup_s,
        gen_tok_s=completion / wall_s if wall_s else 0.0,
        gen_tok_s_incl_warmup=completion / (wall_s + warmup_s) if wall_s + warmup_s else 0.0,
        completion_tokens=completion,
        prompt_tokens_evaluated=evaluated,
        prompt_tok_s=slot_prompt,
        slot_gen_tok_s=completion / (predicted_ms / 1000) if predicted_ms else 0.0,
        ttft_p50_ms=_pct(ttft, 50),
        ttft_p95_ms=_pct(ttft, 95),
        latency_p50_ms=_pct(latency, 50),
        latency_p95_ms=_pct(latency, 95),
        digest_reprefills=reprefills,
        cache_hit_min=min(hits) if hits else 0.0,
        cache_hit_mean=sum(hits) / len(hits) if hits else 0.0,
        peak_rss_mb=peak_rss_mb,
    )


class PeakRss:
    """Peak RSS of this process over a span: VmHWM, reset at the start via clear_refs (Linux)."""

    def __init__(self) -> None:
        self._status = Path("/proc/self/status")

    def reset(self) -> None:
        # Not Linux or not permitted: the peak is then the process's since start.
        with contextlib.suppress(OSError):
            Path("/proc/self/clear_refs").write_text("5")

    def peak_mb(self) -> float:
        try:
            for line in self._status.read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            pass
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
