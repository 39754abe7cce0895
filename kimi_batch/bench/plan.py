"""`kimi-batch plan`: what a partition costs and how much of it fits the nightly window.

Speeds are those one slot sees while all S slots are busy (llama-server reports them per request
in `timings`; `bench` and `tune` write them as `speeds`), so a slot runs its share of the rows one
after another: wall = ceil(rows / S) x (prompt / prompt_speed + output / gen_speed). With S = 1
and single-stream speeds this is the source documents' arithmetic: 16,148 prompt tokens at
6.15 tok/s = 43.8 min.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.errors import MissingInputError

__all__ = [
    "PlanInput",
    "PlanResult",
    "Speeds",
    "describe",
    "last_speeds",
    "plan_partition",
    "save_speeds",
]

SPEEDS_FILE = "speeds.json"


class Speeds(BaseModel):
    """Per-slot speeds measured with `slots` slots busy; `source` names the run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt_tok_s: float = Field(gt=0)
    gen_tok_s: float = Field(gt=0)
    slots: int = Field(ge=1)
    source: str


class PlanInput(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt_tokens: int = Field(
        ge=0, description="Evaluated prompt tokens per row (cache excluded)."
    )
    output_tokens: int = Field(ge=0, description="Generated tokens per row.")
    rows: int = Field(ge=0)
    prompt_tok_s: float = Field(gt=0, description="Prompt speed of one slot.")
    gen_tok_s: float = Field(gt=0, description="Generation speed of one slot.")
    slots: int = Field(default=1, ge=1)
    window_h: float = Field(default=8.0, gt=0, description="The nightly window.")
    digest_tokens: int = Field(default=0, ge=0, description="One-time digest prefill, if cold.")
    partitions: int = Field(default=1, ge=1, description="Runs the rows are split into.")
    run_overhead_s: float = Field(
        default=0.0,
        ge=0,
        description="Server idle per run: process and step starts, writes (`bench --workload "
        "night` measures it).",
    )


class PlanResult(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    inputs: PlanInput
    row_s: float = Field(description="One row on one slot.")
    digest_prefill_s: float
    wall_s: float
    minutes: float
    hours: float
    fits: bool
    max_rows_in_window: int
    rows_in_window: int = Field(description="Of these rows, those done when the window closes.")
    tokens_generated: int


def _split(rows: int, partitions: int) -> list[int]:
    return [rows // partitions + (1 if p < rows % partitions else 0) for p in range(partitions)]


def _rows_in_window(spec: PlanInput, row_s: float, prefill_s: float, window_s: float) -> int:
    """Partition after partition (each one run: its overhead, then its rows on the slots)."""
    clock, done = prefill_s, 0
    for rows in _split(spec.rows, spec.partitions):
        clock += spec.run_overhead_s
        if clock >= window_s:
            break
        need = math.ceil(rows / spec.slots) * row_s
        if clock + need <= window_s:
            clock, done = clock + need, done + rows
            continue
        if row_s > 0:  # the window closes inside this run: the rounds of rows that fit
            done += min(rows, math.floor((window_s - clock) / row_s) * spec.slots)
        break
    return done


def plan_partition(spec: PlanInput) -> PlanResult:
    row_s = spec.prompt_tokens / spec.prompt_tok_s + spec.output_tokens / spec.gen_tok_s
    prefill_s = spec.digest_tokens / spec.prompt_tok_s
    rounds = sum(math.ceil(rows / spec.slots) for rows in _split(spec.rows, spec.partitions))
    wall_s = prefill_s + spec.partitions * spec.run_overhead_s + rounds * row_s
    window_s = spec.window_h * 3600
    fixed_s = prefill_s + spec.run_overhead_s
    if row_s > 0:
        max_rows = max(0, math.floor((window_s - fixed_s) / row_s)) * spec.slots
    else:
        max_rows = spec.rows if fixed_s <= window_s else 0
    return PlanResult(
        inputs=spec,
        row_s=row_s,
        digest_prefill_s=prefill_s,
        wall_s=wall_s,
        minutes=wall_s / 60,
        hours=wall_s / 3600,
        fits=wall_s <= window_s,
        max_rows_in_window=max_rows,
        rows_in_window=_rows_in_window(spec, row_s, prefill_s, window_s),
        tokens_generated=spec.rows * spec.output_tokens,
    )


def describe(result: PlanResult) -> str:
    spec = result.inputs
    verdict = "fits" if result.fits else "does NOT fit"
    return (
        f"{spec.rows} rows x ({spec.prompt_tokens} prompt + {spec.output_tokens} output tokens) "
        f"on {spec.slots} slot(s) at {spec.prompt_tok_s:g}/{spec.gen_tok_s:g} tok/s per slot: "
        f"{result.minutes:.1f} min ({result.hours:.2f} h); {verdict} the {spec.window_h:g} h "
        f"window; at most {result.max_rows_in_window} rows fit"
        + (
            f"; split into {spec.partitions} runs ({spec.run_overhead_s:g} s idle each): "
            f"{result.rows_in_window} of the {spec.rows} rows done in the window"
            if spec.partitions > 1 or spec.run_overhead_s
            else ""
        )
    )


def save_speeds(directory: Path, speeds: Speeds) -> Path:
    """Record a run's speeds where `plan` finds them (the newest file wins)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / SPEEDS_FILE
    path.write_text(speeds.model_dump_json(indent=2))
    return path


def last_speeds(directories: list[Path]) -> Speeds:
    """The most recent speeds written by `bench` or `tune` under these directories."""
    found = [d / SPEEDS_FILE for d in directories if (d / SPEEDS_FILE).is_file()]
    if not found:
        names = ", ".join(str(d) for d in directories)
        raise MissingInputError(
            f"no measured speeds in {names}: run `kimi-batch bench` or `kimi-batch tune`, or "
            "pass --prompt-tok-s and --gen-tok-s"
        )
    newest = max(found, key=lambda path: path.stat().st_mtime)
    return Speeds.model_validate(json.loads(newest.read_text()))
