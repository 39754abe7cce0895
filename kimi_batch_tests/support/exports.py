"""A warehouse of two nights, two sources and a Batch API batch, for the export tests.

Each inbox partition holds two seeds (one with its own instructions, one with earlier turns),
three answers (both seeds and a variant of the first), and quarantine rows of every kind the
quality gates write. `judge` adds a `judged` partition (the judge stage's rows).
"""

from __future__ import annotations

import hashlib
from typing import Any

from kimi_batch.engine import fold_instructions, load_digest
from kimi_batch.llama import TokenLogprob, TopLogprob
from kimi_batch.pipeline import (
    AmplifiedRow,
    DistilledRow,
    JudgedRow,
    QuarantineRow,
    SeedMessage,
    SeedRow,
)
from kimi_batch.settings import Settings
from kimi_batch.warehouse import Warehouse
from kimi_batch_tests.support.rows import CREATED_AT

__all__ = [
    "BATCH_SOURCE",
    "DAYS",
    "INSTRUCTIONS",
    "KD_TOKENS",
    "QUARANTINE_REASONS",
    "SOURCES",
    "answer_id",
    "build_warehouse",
    "judge",
]

DAYS = ("2026-11-29", "2026-11-30")
SOURCES = ("alpha", "beta")
BATCH_SOURCE = "batch_0123456789abcdef01234567"
INSTRUCTIONS = "Answer in one short sentence."
QUARANTINE_REASONS = (
    "duplicate of seed-0 (exact prompt)",
    "near_duplicate of seed-1 (similarity 0.91)",
    "near_duplicate of seed-0 (similarity 0.88)",
    "contaminated: bench.jsonl item q-7 shares 'the quick brown fox'",
    "answer cut off at max_tokens (finish_reason=length): not a final answer",
)
# Three positions of a SmolLM2 answer: each token's id, logprob and top-3 (ids below its
# 49,152-token vocabulary; the middle one sampled outside the top-3, as temperature allows).
KD_TOKENS = [
    TokenLogprob(
        token="Paris",
        logprob=-0.25,
        id=7042,
        top=[
            TopLogprob(token="Paris", logprob=-0.25, id=7042),
            TopLogprob(token="Lyon", logprob=-2.5, id=40514),
            TopLogprob(token="The", logprob=-3.0, id=504),
        ],
    ),
    TokenLogprob(
        token=" is",
        logprob=-4.5,
        id=314,
        top=[
            TopLogprob(token=".", logprob=-0.1, id=30),
            TopLogprob(token=",", logprob=-3.0, id=28),
            TopLogprob(token="!", logprob=-4.0, id=17),
        ],
    ),
    TokenLogprob(
        token=".",
        logprob=-0.01,
        id=30,
        top=[
            TopLogprob(token=".", logprob=-0.01, id=30),
            TopLogprob(token="!", logprob=-5.0, id=17),
            TopLogprob(token=" it", logprob=-6.0, id=357),
        ],
    ),
]


def answer_id(ds: str, source: str, index: int) -> str:
    return f"{ds}-{source}-answer-{index}"


def _sha(*parts: str) -> str:
    return hashlib.sha256("|".join(parts).encode()).hexdigest()


def _seeds(ds: str, source: str) -> list[SeedRow]:
    first = f"What is the capital of France ({source}, {ds})?"
    common: dict[str, Any] = {"source_file": f"{source}.jsonl", "input_sha256": _sha(ds, source)}
    return [
        SeedRow(
            input_id="seed-0",
            messages=[SeedMessage(role="user", content=fold_instructions(INSTRUCTIONS, first))],
            prompt=first,
            instructions=INSTRUCTIONS,
            temperature=0.2,
            line=1,
            created_at=CREATED_AT,
            **common,
        ),
        SeedRow(
            input_id="seed-1",
            messages=[
                SeedMessage(role="user", content="Hi, I have a sum for you."),
                SeedMessage(role="assistant", content="Go ahead."),
                SeedMessage(role="user", content=f"What is 2+2 in {source}?"),
            ],
            prompt=f"What is 2+2 in {source}?",
            instructions=None,
            line=2,
            created_at=CREATED_AT,
            **common,
        ),
    ]


def _variant(ds: str, source: str) -> AmplifiedRow:
    return AmplifiedRow(
        **_generation(f"{ds}-{source}-variant", "seed-0", "0" * 64, _sha(ds, source), 0),
        seed_id="seed-0",
        strategy="paraphrase",
        prompt=f"Name France's capital city ({source}).",
    )


def _generation(
    request_id: str, input_id: str, digest: str, input_sha: str, index: int
) -> dict[str, Any]:
    return {
        "request_id": request_id,
        "input_id": input_id,
        "model": "smollm2-135m",
        "digest_sha256": digest,
        "prompt_tokens": 100 + 10 * index,
        "cached_tokens": 90,
        "completion_tokens": 5 + index,
        "finish_reason": "stop",
        "prompt_ms": 1.0,
        "predicted_ms": 2.0,
        "latency_ms": 3.0,
        "endpoint": "http://127.0.0.1:8081",
        "created_at": CREATED_AT,
        "input_sha256": input_sha,
    }


def _answers(ds: str, source: str, digest: str, *, logprobs: bool) -> list[DistilledRow]:
    seeds, variant = _seeds(ds, source), _variant(ds, source)
    asked = [(seeds[0], "seed", None), (seeds[1], "seed", None), (variant, "variant", "paraphrase")]
    return [
        DistilledRow(
            **_generation(
                answer_id(ds, source, i),
                row.request_id if isinstance(row, AmplifiedRow) else row.input_id,
                digest,
                _sha(ds, source),
                i,
            ),
            seed_id=row.seed_id if isinstance(row, AmplifiedRow) else row.input_id,
            origin=origin,
            strategy=strategy,
            prompt=row.prompt,
            response=f"Answer {i} for {source} on {ds}.",
            structured=None,
            logprobs=KD_TOKENS if logprobs else None,
        )
        for i, (row, origin, strategy) in enumerate(asked)
    ]


def _quarantine(ds: str, source: str) -> list[QuarantineRow]:
    return [
        QuarantineRow(
            request_id=None,
            input_id=f"q-{i}",
            model=None,
            digest_sha256=None,
            stage="distill",
            source_file=f"{source}.jsonl",
            line=10 + i,
            reason=reason,
            raw="{}",
            created_at=CREATED_AT,
        )
        for i, reason in enumerate(QUARANTINE_REASONS)
    ]


def build_warehouse(settings: Settings, *, logprobs: bool = True) -> Warehouse:
    """Every partition of `DAYS` x `SOURCES`, answered under the configured digest, and a Batch
    API batch's answers on the second day."""
    warehouse = Warehouse(settings.paths.warehouse_dir)
    digest = load_digest(settings.digest).sha256
    for ds in DAYS:
        for source in SOURCES:
            warehouse.write_partition("seeds", ds, source, _seeds(ds, source))
            warehouse.write_partition("amplified", ds, source, [_variant(ds, source)])
            answers = _answers(ds, source, digest, logprobs=logprobs)
            warehouse.write_partition("distilled", ds, source, answers)
            warehouse.write_partition("quarantine", ds, source, _quarantine(ds, source))
    batch = _answers(DAYS[1], BATCH_SOURCE, _sha("batch system"), logprobs=logprobs)[:2]
    warehouse.write_partition("distilled", DAYS[1], BATCH_SOURCE, batch)
    return warehouse


def judge(warehouse: Warehouse, ds: str, source: str, scores: dict[str, int]) -> int:
    """A `judged` partition scoring the answers named (request id -> score); its snapshot."""
    rows = [
        JudgedRow(
            **_generation(f"judge-{answer}", answer, "0" * 64, _sha(ds, source), 0),
            answer_request_id=answer,
            score=score,
            reason=f"scored {score}",
        )
        for answer, score in scores.items()
    ]
    return warehouse.write_partition("judged", ds, source, rows).snapshot_id
