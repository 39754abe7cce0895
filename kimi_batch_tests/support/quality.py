"""Inputs for the quality gate's tests: landed seeds, their teacher answers as the engine returns
them, and a small benchmark file (none ships with the package)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from kimi_batch.engine import BatchOutcome, GenerationResult, fold_instructions
from kimi_batch.engine.stats import StatsAccumulator
from kimi_batch.pipeline import DistillInputs, DistillTask, SeedMessage, SeedRow
from kimi_batch.warehouse import Warehouse
from kimi_batch_tests.support.results import make_result
from kimi_batch_tests.support.rows import CREATED_AT

__all__ = [
    "BENCHMARK_ITEM",
    "answers_to",
    "benchmark_file",
    "land_seeds_of",
    "outcome_of",
    "seed_row",
]

# A GSM8K-style item (written here, not copied from the benchmark).
BENCHMARK_ITEM = (
    "A baker fills 3 trays with 12 rolls each and sells half of the rolls before noon. How many "
    "rolls does the baker have left to sell in the afternoon?"
)


def benchmark_file(folder: Path, name: str = "bakery_eval.jsonl") -> Path:
    """A two-item benchmark (an `id`, a question and an answer each) as a JSONL file."""
    path = folder / name
    items = [
        {"id": "bake-1", "question": BENCHMARK_ITEM, "answer": "18"},
        {"id": "bake-2", "question": "What is 7 times 8?", "answer": "56"},
    ]
    path.write_text("".join(json.dumps(item) + "\n" for item in items), encoding="utf-8")
    return path


def seed_row(
    input_id: str,
    prompt: str,
    *,
    source_file: str = "night.jsonl",
    line: int = 1,
    turns: Sequence[str] = (),
    instructions: str | None = None,
) -> SeedRow:
    """A landed seed; `turns` are earlier user/assistant turns before `prompt`; `instructions`
    are folded into the first user turn, as the reader folds them."""
    said = [*turns, prompt]
    said[0] = fold_instructions(instructions, said[0])
    messages = [
        SeedMessage(role="user" if n % 2 == 0 else "assistant", content=text)
        for n, text in enumerate(said)
    ]
    return SeedRow(
        input_id=input_id,
        messages=messages,
        prompt=prompt,
        instructions=instructions,
        source_file=source_file,
        line=line,
        input_sha256="0" * 64,
        created_at=CREATED_AT,
    )


def land_seeds_of(store: Warehouse, ds: str, source: str, prompts: Sequence[str]) -> DistillInputs:
    """`prompts` landed as the partition's seeds (ids `<source>-<n>`, lines from 1); what the
    distill stage then reads of it."""
    rows = [
        seed_row(f"{source}-{n}", prompt, source_file=f"{source}.jsonl", line=n + 1)
        for n, prompt in enumerate(prompts)
    ]
    store.write_partition("seeds", ds, source, rows)
    return DistillTask().load(lambda table, model: store.read_rows(table, ds, source, model))


def answers_to(task: DistillTask, inputs: DistillInputs, source: str) -> list[GenerationResult]:
    """A final answer to each of the stage's requests, as the engine hands them to landing."""
    return [
        make_result(
            f"The answer to {request.input_id}.",
            request_id=f"{source}-req-{n}",
            input_id=request.input_id,
            tag=request.tag,
        )
        for n, request in enumerate(task.requests(inputs))
    ]


def outcome_of(results: Sequence[GenerationResult]) -> BatchOutcome:
    """The engine's outcome of a batch that generated `results` (its figures; no failures)."""
    figures = StatsAccumulator(digest_tokens=100)
    for result in results:
        figures.add(result)
    stats = figures.summary(
        total=len(results),
        from_ledger=0,
        failed=0,
        not_started=0,
        clamped=0,
        digest_reprefills=0,
        hangs=0,
        max_in_flight=1,
        wall_s=1.0,
    )
    return BatchOutcome(
        model="smollm2", digest_sha256="d" * 64, planned=[], failures=[], stats=stats, warmups=[]
    )
