"""The quality gates' variables: duplicates, benchmark decontamination and the judge stage.

`Settings` inherits these fields (one flat contract, one reference table), and `Settings.from_env`
reads them with the rest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from kimi_batch.settings.defaults import (
    DEFAULT_CONTAMINATION_MAX_RATE,
    DEFAULT_CONTAMINATION_NGRAM,
    DEFAULT_DEDUP_SHINGLE,
    DEFAULT_DEDUP_THRESHOLD,
    default_judge_rubric_path,
)
from kimi_batch.settings.environment import PATH, PATHS

DedupFields = Literal["prompt", "prompt+answer"]


class QualitySettings(BaseModel):
    """The fields of `Settings` that say which rows are fit to train on."""

    dedup: bool = Field(
        default=True,
        description="`off`: no duplicate removal (exact and near duplicates across every night "
        "stay in `distilled`).",
        json_schema_extra={"shown_default": "`on`"},
    )
    dedup_fields: DedupFields = Field(
        default="prompt",
        description="What near-duplicates are judged on: `prompt`, or `prompt+answer`.",
    )
    dedup_threshold: float = Field(
        default=DEFAULT_DEDUP_THRESHOLD,
        gt=0,
        lt=1,
        description="Estimated Jaccard similarity (MinHash LSH) at which a row is a near-duplicate "
        "of a kept one.",
    )
    dedup_shingle: int = Field(
        default=DEFAULT_DEDUP_SHINGLE,
        ge=1,
        description="Words per shingle of the near-duplicate MinHash.",
    )
    benchmarks: Annotated[tuple[Path, ...], PATHS] = Field(
        default=(),
        description="Benchmark files (JSONL or Parquet: an `id` and text fields) whose n-grams "
        "rows must not share; space or comma separated.",
        json_schema_extra={"shown_default": "none"},
    )
    contamination_ngram: int = Field(
        default=DEFAULT_CONTAMINATION_NGRAM,
        ge=3,
        description="Words in the n-gram a row may not share with a benchmark item (normalized).",
    )
    contamination_max_rate: float = Field(
        default=DEFAULT_CONTAMINATION_MAX_RATE,
        ge=0,
        le=1,
        description="The contamination check fails when a partition's share of contaminated rows "
        "is above this.",
    )
    judge_nightly: bool = Field(
        default=False,
        description="`on`: the night runs the judge stage after distillation (on the target a "
        "judge pass costs about as much as the answer).",
        json_schema_extra={"shown_default": "`off`"},
    )
    judge_rubric: Annotated[Path, PATH] = Field(
        default_factory=default_judge_rubric_path,
        description="The judge stage's rubric (the system prompt it grades by).",
        json_schema_extra={"shown_default": "`kimi_batch/data/judge_rubric.md`"},
    )
