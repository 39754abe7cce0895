"""The dataset card of an `hf` export: how the rows were made, as figures, then as `README.md`.

The YAML header is what the Hugging Face Hub and `datasets.load_dataset(folder)` read (the one
`train` split of `data/*.parquet`); the body is for a person.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "DatasetCard",
    "DedupFigures",
    "InputSource",
    "SamplingFigures",
    "TokenStats",
    "quarantine_counts",
    "reason_kind",
]

_FIRST_WORD = re.compile(r"[A-Za-z_]+")


def reason_kind(reason: str) -> str:
    """A quarantine reason's first word (`duplicate`, `near_duplicate`, `contaminated` ...)."""
    found = _FIRST_WORD.match(reason.strip())
    return found.group(0).lower() if found else "other"


class _Figures(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TokenStats(_Figures):
    count: int = Field(ge=0)
    mean: float
    p50: int
    p95: int
    max: int

    @classmethod
    def of(cls, values: Sequence[int]) -> TokenStats:
        """Nearest-rank percentiles (a value that occurs), so they read as token counts."""
        ordered = sorted(values)
        if not ordered:
            return cls(count=0, mean=0.0, p50=0, p95=0, max=0)

        def rank(p: float) -> int:
            return ordered[max(0, math.ceil(p * len(ordered)) - 1)]

        return cls(
            count=len(ordered),
            mean=round(sum(ordered) / len(ordered), 2),
            p50=rank(0.5),
            p95=rank(0.95),
            max=ordered[-1],
        )


class InputSource(_Figures):
    """One partition's landed input: the sha256 of the versions its rows were built from."""

    ds: str
    source: str
    file: str | None = Field(description="The inbox file's name, when the manifest knows it.")
    input_sha256: list[str]
    latest_sha256: str | None = Field(description="The newest landed version (the manifest).")
    rows: int = Field(ge=0)

    @property
    def landed(self) -> str:
        if self.latest_sha256 is None:
            return "not in the landing manifest"
        return (
            "current" if self.input_sha256 == [self.latest_sha256] else "stale: newer input landed"
        )


class SamplingFigures(_Figures):
    recorded: bool = Field(description="False: the rows do not record their sampling.")
    params: dict[str, float | int | None]
    top_k_logprobs: int = Field(ge=0, description="Top-k of the rows' logprobs (0: none).")
    rows_with_overrides: int = Field(ge=0, description="Seeds that set their own sampling.")
    note: str


class DedupFigures(_Figures):
    dedup: bool
    dedup_fields: str
    dedup_threshold: float
    dedup_shingle: int
    benchmarks: list[str]
    contamination_ngram: int


class DatasetCard(_Figures):
    rows: int = Field(ge=0)
    snapshots: dict[str, int] = Field(
        default_factory=dict, description="The Iceberg snapshot of each table the rows came from."
    )
    models: list[str]
    digest_sha256: list[str]
    sources: list[InputSource]
    sampling: SamplingFigures
    quarantine: dict[str, int] = Field(description="Quarantined rows by reason's first word.")
    quality: DedupFigures
    prompt_tokens: TokenStats
    completion_tokens: TokenStats
    min_judge_score: int | None
    judged_rows: int = Field(ge=0)
    judge_scores: dict[int, int] = Field(default_factory=dict, description="Rows by score.")
    dropped_unjudged: int = Field(ge=0)
    dropped_below_score: int = Field(ge=0)

    def render(self) -> str:
        return "\n".join([*_header(self.rows), *_body(self), ""])


def _size_category(rows: int) -> str:
    for bound, name in ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K")):
        if rows < bound:
            return name
    return "100K<n<1M" if rows < 1_000_000 else "n>1M"


def _header(rows: int) -> list[str]:
    return [
        "---",
        "configs:",
        "- config_name: default",
        "  data_files:",
        "  - split: train",
        "    path: data/*.parquet",
        "task_categories:",
        "- text-generation",
        "tags:",
        "- distillation",
        "- synthetic",
        "size_categories:",
        f"- {_size_category(rows)}",
        "---",
    ]


def _table(head: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    return [*lines, *("| " + " | ".join(str(cell) for cell in row) + " |" for row in rows)]


def _body(card: DatasetCard) -> list[str]:
    return [
        "",
        "# Distilled answers",
        "",
        f"{card.rows} teacher answers from kimi-batch's `distilled` table, one conversation each "
        "(`messages`: system digest, user side, answer).",
        "",
        f"- Model: {', '.join(f'`{m}`' for m in card.models) or 'none'}",
        f"- System digest sha256: {', '.join(f'`{d}`' for d in card.digest_sha256) or 'none'}",
        *_judge_lines(card),
        "",
        "## Snapshots",
        "",
        "The Iceberg snapshot of each warehouse table the rows were read from: each table "
        "reads as it was then, whatever later nights replaced.",
        "",
        *_table(("table", "snapshot id"), sorted(card.snapshots.items()) or [("none", "")]),
        "",
        "## Sources",
        "",
        *_table(
            ("ds", "source", "file", "input sha256", "rows", "latest landed"),
            _source_rows(card.sources),
        ),
        "",
        "## Sampling",
        "",
        card.sampling.note,
        "",
        *_table(("parameter", "value"), sorted(card.sampling.params.items())),
        "",
        f"Top-k logprobs per token: {card.sampling.top_k_logprobs}. Seeds with their own "
        f"sampling overrides: {card.sampling.rows_with_overrides}.",
        "",
        "## Quarantine (rows kept out, by reason)",
        "",
        *_table(("reason", "rows"), sorted(card.quarantine.items()) or [("none", 0)]),
        "",
        "## Duplicates and decontamination",
        "",
        *_table(("setting", "value"), _quality_rows(card.quality)),
        "",
        "## Tokens",
        "",
        *_table(("tokens", "count", "mean", "p50", "p95", "max"), _token_rows(card)),
    ]


def _source_rows(sources: Sequence[InputSource]) -> list[tuple[object, ...]]:
    return [
        (
            s.ds,
            s.source,
            s.file or "",
            ", ".join(f"`{sha}`" for sha in s.input_sha256),
            s.rows,
            s.landed,
        )
        for s in sources
    ]


def _token_rows(card: DatasetCard) -> list[tuple[object, ...]]:
    pairs = (("prompt", card.prompt_tokens), ("completion", card.completion_tokens))
    return [(name, s.count, s.mean, s.p50, s.p95, s.max) for name, s in pairs]


def _judge_lines(card: DatasetCard) -> list[str]:
    lines = [f"- Judged rows: {card.judged_rows}"]
    if card.judge_scores:
        spread = ", ".join(f"{score}: {n}" for score, n in sorted(card.judge_scores.items()))
        lines.append(f"- Judge scores (score: rows): {spread}")
    if card.min_judge_score is not None:
        lines.append(
            f"- Judge score floor: {card.min_judge_score} ({card.dropped_below_score} rows below "
            f"it and {card.dropped_unjudged} unjudged rows left out)"
        )
    return lines


def _quality_rows(quality: DedupFigures) -> list[tuple[str, object]]:
    return [
        ("duplicate removal", "on" if quality.dedup else "off"),
        ("near-duplicates judged on", quality.dedup_fields),
        ("near-duplicate threshold (MinHash Jaccard)", quality.dedup_threshold),
        ("shingle (words)", quality.dedup_shingle),
        ("benchmarks", ", ".join(quality.benchmarks) or "none"),
        ("contamination n-gram (words)", quality.contamination_ngram),
    ]


def quarantine_counts(reasons: Sequence[str]) -> dict[str, int]:
    return dict(Counter(reason_kind(reason) for reason in reasons))
