"""`kimi-batch plan`: what a partition costs and how much of it fits the nightly window.

Two speed sources. Measured per-slot speeds (those one slot sees while all S slots are busy, as
llama-server reports them in `timings`; `bench` and `tune` write them as `speeds`): a slot runs
its share of the rows one after another, wall = ceil(rows / S) x (prompt / prompt_speed +
output / gen_speed), the speeds taken as flat (measure them at your digest's length). With S = 1
and single-stream speeds this is the source documents' arithmetic: 16,148 prompt tokens at
6.15 tok/s = 43.8 min.

Or the target's speed model (`--target`, `speed_model.TargetProfile`, the model the stand-in runs
on): a round of n slots evaluates n prompts after the `context_tokens` already cached (the
digest), one slot at a time (a step holds every slot), then decodes in lockstep with every step
slower than the last as the context grows (digest + prompt + tokens generated so far), the slots
sharing the weight passes; the last round of a batch has the rows left over.

Then the night, one run over every partition (the nightly schedule's `nightly_job`): the digest's
cold prefill, the night's overhead (the run's start), each partition's overhead (its lease, its
seeds landed, its stage planned: all before the first request), then the rows of all partitions
as one batch, oldest partition first, round after round until the window closes
(`rows_in_window`, whole rounds; a round does not wait for a partition's end). The next night
runs what is left, paying the night's overhead again and that of each partition with rows left
(`next_night_rows`, `nights_needed`).

With the judge stage (`judge_prompt_tokens` > 0) every row costs a second request after its
answer: the rubric, the request and the answer read, a verdict written; `judge_s` is its share.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kimi_batch.errors import MissingInputError
from kimi_batch_bench.speed_model import TargetProfile

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
_MAX_NIGHTS = 10_000  # a plan needing more nights than this says so instead of counting them


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
    prompt_tok_s: float | None = Field(default=None, gt=0, description="Prompt speed of a slot.")
    gen_tok_s: float | None = Field(default=None, gt=0, description="Generation speed of a slot.")
    target: TargetProfile | None = Field(
        default=None, description="The target's speed model, instead of measured speeds."
    )
    context_tokens: int = Field(
        default=0,
        ge=0,
        description="Tokens cached in the slot before a row's prompt (the digest): with "
        "`target`, where the context of every row starts.",
    )
    slots: int = Field(default=1, ge=1)
    window_h: float = Field(default=8.0, gt=0, description="The nightly window.")
    digest_tokens: int = Field(default=0, ge=0, description="One-time digest prefill, if cold.")
    partitions: int = Field(
        default=1, ge=1, description="Partitions the rows are split into (one night run)."
    )
    night_overhead_s: float = Field(
        default=0.0,
        ge=0,
        description="Server idle once a night: the run's start (`bench --workload night` and "
        "`--workload rehearsal` measure it).",
    )
    partition_overhead_s: float = Field(
        default=0.0,
        ge=0,
        description="Server idle per partition of the night before its first request: its "
        "lease, its seeds landed.",
    )

    judge_prompt_tokens: int = Field(
        default=0,
        ge=0,
        description="The judge stage's prompt per row (rubric, request and answer); 0: no judge.",
    )
    judge_output_tokens: int = Field(default=0, ge=0, description="The judge's verdict per row.")

    @model_validator(mode="after")
    def _has_speeds(self) -> Self:
        if self.target is None and (self.prompt_tok_s is None or self.gen_tok_s is None):
            raise ValueError("give prompt_tok_s and gen_tok_s, or the target's speed model")
        return self


class PlanResult(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    inputs: PlanInput
    row_s: float = Field(description="One row on one slot (a round of all slots).")
    prompt_tok_s: float = Field(description="Prompt speed of a slot in a full round.")
    gen_tok_s: float = Field(description="Generation speed of a slot in a full round.")
    digest_prefill_s: float
    wall_s: float
    minutes: float
    hours: float
    fits: bool
    max_rows_in_window: int
    rows_in_window: int = Field(description="Of these rows, those done when the window closes.")
    rows_left: int = Field(description="Rows the next night starts with.")
    next_night_rows: int = Field(description="Rows the next night's window closes on.")
    nights_needed: int | None = Field(description="Nights to the last row (None: never).")
    tokens_generated: int
    judge_s: float = Field(default=0.0, description="Of `wall_s`, the judge stage's seconds.")


def _split(rows: int, partitions: int) -> list[int]:
    return [rows // partitions + (1 if p < rows % partitions else 0) for p in range(partitions)]


class _Rounds:
    """Seconds of a round of n rows, from measured speeds or from the target's speed model."""

    def __init__(self, spec: PlanInput, *, judging: bool = True) -> None:
        self.spec = spec
        # A judged row is two requests: its answer, then its verdict (the same slots).
        self.judge = (
            _Rounds(
                spec.model_copy(
                    update={
                        "prompt_tokens": spec.judge_prompt_tokens,
                        "output_tokens": spec.judge_output_tokens,
                    }
                ),
                judging=False,
            )
            if judging and spec.judge_prompt_tokens
            else None
        )

    def prompt_s(self, slots: int) -> float:
        spec = self.spec
        if spec.target is None:
            assert spec.prompt_tok_s is not None
            return spec.prompt_tokens / spec.prompt_tok_s
        return slots * spec.target.prefill_cost(spec.context_tokens, spec.prompt_tokens)

    def decode_s(self, slots: int) -> float:
        spec = self.spec
        if spec.target is None:
            assert spec.gen_tok_s is not None
            return spec.output_tokens / spec.gen_tok_s
        position = spec.context_tokens + spec.prompt_tokens
        return spec.target.decode_cost(position, spec.output_tokens, slots)

    def round_s(self, slots: int) -> float:
        if slots <= 0:
            return 0.0
        judge_s = self.judge.round_s(slots) if self.judge else 0.0
        return self.prompt_s(slots) + self.decode_s(slots) + judge_s

    def digest_s(self) -> float:
        spec = self.spec
        if spec.target is None:
            assert spec.prompt_tok_s is not None
            return spec.digest_tokens / spec.prompt_tok_s
        return spec.target.prefill_cost(0, spec.digest_tokens)

    def batch_s(self, rows: int) -> float:
        """One batch of `rows` (every partition of a night): full rounds, then the rest."""
        full, rest = divmod(rows, self.spec.slots)
        return full * self.round_s(self.spec.slots) + self.round_s(rest)


def _night(spec: PlanInput, rounds: _Rounds, left: list[int], clock: float) -> list[int]:
    """One night from `clock` on: the run's overhead, each partition's with rows left, then the
    rows of all of them in one batch (oldest partition first) round after round; returns the
    rows each partition has left at the window's close."""
    window_s = spec.window_h * 3600
    clock += spec.night_overhead_s + spec.partition_overhead_s * sum(1 for rows in left if rows)
    rows, done = sum(left), 0
    while rows and clock < window_s:
        n = min(rows, spec.slots)
        if clock + rounds.round_s(n) > window_s:
            break
        clock, rows, done = clock + rounds.round_s(n), rows - n, done + n
    after = []
    for rows in left:  # the rows done are the oldest partitions' first
        taken = min(rows, done)
        after.append(rows - taken)
        done -= taken
    return after


def _nights(spec: PlanInput, rounds: _Rounds) -> list[int]:
    """Rows done each night until none are left (the digest is cold only the first night)."""
    left, done = _split(spec.rows, spec.partitions), []
    clock = rounds.digest_s()
    while sum(left) and len(done) < _MAX_NIGHTS:
        after = _night(spec, rounds, left, clock)
        done.append(sum(left) - sum(after))
        if done[-1] == 0:
            break
        left, clock = after, 0.0
    return done


def plan_partition(spec: PlanInput) -> PlanResult:
    rounds = _Rounds(spec)
    row_s = rounds.round_s(spec.slots)
    prefill_s = rounds.digest_s()
    overhead_s = spec.night_overhead_s + spec.partitions * spec.partition_overhead_s
    fixed_s = prefill_s + overhead_s
    wall_s = fixed_s + rounds.batch_s(spec.rows)  # one batch over every partition
    window_s = spec.window_h * 3600
    if row_s > 0:
        max_rows = max(0, math.floor((window_s - fixed_s) / row_s)) * spec.slots
    else:
        max_rows = spec.rows if fixed_s <= window_s else 0
    nights = _nights(spec, rounds)
    in_window = nights[0] if nights else 0
    finished = sum(nights) == spec.rows
    prompt_s, decode_s = rounds.prompt_s(spec.slots), rounds.decode_s(spec.slots)
    return PlanResult(
        inputs=spec,
        row_s=row_s,
        prompt_tok_s=spec.prompt_tokens / prompt_s if prompt_s else 0.0,
        gen_tok_s=spec.output_tokens / decode_s if decode_s else 0.0,
        digest_prefill_s=prefill_s,
        wall_s=wall_s,
        minutes=wall_s / 60,
        hours=wall_s / 3600,
        fits=wall_s <= window_s,
        max_rows_in_window=max_rows,
        rows_in_window=in_window,
        rows_left=spec.rows - in_window,
        next_night_rows=nights[1] if len(nights) > 1 else 0,
        nights_needed=len(nights) if finished else None,
        tokens_generated=spec.rows * (spec.output_tokens + spec.judge_output_tokens),
        judge_s=rounds.judge.batch_s(spec.rows) if rounds.judge else 0.0,
    )


def describe(result: PlanResult) -> str:
    spec = result.inputs
    verdict = "fits" if result.fits else "does NOT fit"
    speeds = (
        f"the target's speed model ({result.prompt_tok_s:.3g}/{result.gen_tok_s:.3g} tok/s per "
        f"slot after {spec.context_tokens} context tokens)"
        if spec.target is not None
        else f"{spec.prompt_tok_s:g}/{spec.gen_tok_s:g} tok/s per slot"
    )
    nights = (
        f"{result.nights_needed} night(s) in all"
        if result.nights_needed is not None
        else "never done (no row fits a window)"
    )
    return (
        f"{spec.rows} rows x ({spec.prompt_tokens} prompt + {spec.output_tokens} output tokens) "
        f"on {spec.slots} slot(s) at {speeds}: "
        f"{result.minutes:.1f} min ({result.hours:.2f} h); {verdict} the {spec.window_h:g} h "
        f"window; at most {result.max_rows_in_window} rows fit"
        + (
            f"; one night run over {spec.partitions} partition(s) ({spec.night_overhead_s:g} s "
            f"idle a night, {spec.partition_overhead_s:g} s a partition)"
            if spec.partitions > 1 or spec.night_overhead_s or spec.partition_overhead_s
            else ""
        )
        + (
            f"; the judge stage ({spec.judge_prompt_tokens} prompt + {spec.judge_output_tokens} "
            f"output tokens a row) is {result.judge_s / 60:.1f} min of it "
            f"({result.judge_s / result.wall_s:.0%})"
            if spec.judge_prompt_tokens and result.wall_s
            else ""
        )
        + (
            f"; {result.rows_in_window} of the {spec.rows} rows done in the window, "
            f"{result.rows_left} left, {result.next_night_rows} the next night, {nights}"
            if not result.fits
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
