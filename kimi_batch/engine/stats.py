"""Batch statistics and progress events (numbers the Dagster UI plots)."""

from __future__ import annotations

import re
import statistics
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.engine.generation import GenerationResult

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
    watchdog: str = Field(
        default="", description="The hang detection in force, e.g. 'stall after 60 s (...)'."
    )

    def __str__(self) -> str:
        eta = f"{self.eta_s:.0f} s" if self.eta_s is not None else "?"
        watchdog = f"; watchdog: {self.watchdog}" if self.watchdog else ""
        return (
            f"{self.done}/{self.total} rows ({self.failed} failed), "
            f"{self.completion_tokens_per_s:.1f} tok/s, ETA {eta}{watchdog}"
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
    not_started: int = Field(
        default=0, description="Not dispatched because the run's stop time passed."
    )
    clamped: int = Field(description="Requests whose max_tokens was cut to the server n_predict.")
    truncated: int = Field(default=0, description="Generated answers that stopped at max_tokens.")
    empty: int = Field(default=0, description="Generated answers with no text.")
    prompt_tokens: int
    cached_tokens: int
    evaluated_tokens: int
    completion_tokens: int
    prompt_tokens_per_s: float = Field(description="Evaluated prompt tokens / prompt time.")
    completion_tokens_per_s: float = Field(description="Generated tokens / wall time.")
    cache_hit_ratio: float = Field(description="min(cached / digest tokens) over the requests.")
    digest_reprefills: int = Field(description="Requests or re-warms that prefilled the digest.")
    digest_warmups: int = Field(
        default=0,
        description="Request digests prefilled once by a warm-up and saved for the other slots.",
    )
    digest_restores: int = Field(
        default=0, description="Saved digests restored into a slot during the batch."
    )
    own_digest_prefills: int = Field(
        default=0,
        description="Requests that prefilled their own digest, one no other slot ran (no save).",
    )
    slot_saves_peak: int = Field(
        default=0, description="The most slot-save files of the batch's own at once."
    )
    hangs: int = Field(default=0, description="Times an endpoint was declared hung and restarted.")
    max_in_flight: int
    in_flight_at_start: int = Field(
        default=0,
        description="Requests of the same run in flight when this batch was added to it: above "
        "0, the slots did not drain before it (0 for a batch that starts its run).",
    )
    latency_p50_ms: float
    latency_p95_ms: float
    wall_s: float


def _percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


class StatsAccumulator:
    """Running sums over the results generated in a run: nothing but numbers is kept."""

    def __init__(self, digest_tokens: int = 0) -> None:
        self.digest_tokens = digest_tokens  # the engine's digest: `add`'s default
        self.generated = 0
        self.truncated = 0
        self.empty = 0
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.evaluated_tokens = 0
        self.completion_tokens = 0
        self.prompt_ms = 0.0
        self.latencies: list[float] = []  # one float per row: 8 bytes, not a result
        self.min_cache_ratio = 1.0

    def add(self, result: GenerationResult, *, digest_tokens: int | None = None) -> None:
        """Count `result`; its cache hit is `cached / digest_tokens` (default: the engine's
        digest; 0: a digest it had to prefill by design, or none: no hit to expect)."""
        if digest_tokens is None:
            digest_tokens = self.digest_tokens
        self.generated += 1
        self.truncated += result.truncated
        self.empty += result.empty
        self.prompt_tokens += result.prompt_tokens
        self.cached_tokens += result.cached_tokens
        self.evaluated_tokens += result.prompt_tokens - result.cached_tokens
        self.completion_tokens += result.completion_tokens
        self.prompt_ms += result.prompt_ms
        self.latencies.append(result.latency_ms)
        if digest_tokens:
            # Compared before dividing: a count past any float (JSON holds any integer, the
            # ledger keeps it) made `/` raise OverflowError here, inside the engine's recording.
            cached = result.cached_tokens
            ratio = 1.0 if cached >= digest_tokens else cached / digest_tokens
            self.min_cache_ratio = min(self.min_cache_ratio, ratio)

    def summary(
        self,
        *,
        total: int,
        from_ledger: int,
        failed: int,
        not_started: int,
        clamped: int,
        digest_reprefills: int,
        hangs: int,
        max_in_flight: int,
        wall_s: float,
        in_flight_at_start: int = 0,
        digest_warmups: int = 0,
        digest_restores: int = 0,
        own_digest_prefills: int = 0,
        slot_saves_peak: int = 0,
    ) -> BatchStats:
        latencies = sorted(self.latencies)
        seconds = self.prompt_ms / 1000
        return BatchStats(
            total=total,
            generated=self.generated,
            from_ledger=from_ledger,
            failed=failed,
            not_started=not_started,
            clamped=clamped,
            truncated=self.truncated,
            empty=self.empty,
            prompt_tokens=self.prompt_tokens,
            cached_tokens=self.cached_tokens,
            evaluated_tokens=self.evaluated_tokens,
            completion_tokens=self.completion_tokens,
            prompt_tokens_per_s=self.evaluated_tokens / seconds if seconds > 0 else 0.0,
            completion_tokens_per_s=self.completion_tokens / wall_s if wall_s > 0 else 0.0,
            cache_hit_ratio=self.min_cache_ratio,
            digest_reprefills=digest_reprefills,
            digest_warmups=digest_warmups,
            digest_restores=digest_restores,
            own_digest_prefills=own_digest_prefills,
            slot_saves_peak=slot_saves_peak,
            hangs=hangs,
            max_in_flight=max_in_flight,
            in_flight_at_start=in_flight_at_start,
            latency_p50_ms=_percentile(latencies, 50),
            latency_p95_ms=_percentile(latencies, 95),
            wall_s=wall_s,
        )
