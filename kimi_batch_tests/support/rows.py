"""Hand-built table rows (amplified, distilled, quarantine) for the storage and export tests."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from kimi_batch.llama import TokenLogprob, TopLogprob
from kimi_batch.pipeline import (
    AmplifiedRow,
    DistilledRow,
    QuarantineRow,
    SeedMessage,
    SeedRow,
)

__all__ = ["CREATED_AT", "amplified", "distilled", "quarantined", "seeds"]

CREATED_AT = datetime(2024, 5, 1, 12, 30, 15, 123456, tzinfo=UTC)


def _generation(request_id: str, input_id: str) -> dict[str, Any]:
    return {
        "request_id": request_id,
        "input_id": input_id,
        "model": "smollm2-135m",
        "digest_sha256": "ab" * 32,
        "prompt_tokens": 120,
        "cached_tokens": 100,
        "completion_tokens": 17,
        "finish_reason": "stop",
        "prompt_ms": 12.5,
        "predicted_ms": 80.25,
        "latency_ms": 95.0,
        "endpoint": "http://127.0.0.1:8081",
        "created_at": CREATED_AT,
    }


def amplified(n: int, *, prefix: str = "amp") -> list[AmplifiedRow]:
    return [
        AmplifiedRow(
            **_generation(f"{prefix}-{i}", f"seed-{i}"),
            seed_id=f"seed-{i}",
            strategy="paraphrase",
            prompt=f"variant {i} of seed {i}",
        )
        for i in range(n)
    ]


def distilled(
    variants: list[AmplifiedRow], *, with_logprobs: bool = True, prefix: str = "dis"
) -> list[DistilledRow]:
    """One answer per variant; `input_id` points at the variant's `request_id`."""
    logprobs = [
        TokenLogprob(
            token="Paris",
            logprob=-0.25,
            top=[TopLogprob(token="Paris", logprob=-0.25), TopLogprob(token="Lyon", logprob=-2.5)],
        )
    ]
    return [
        DistilledRow(
            **_generation(f"{prefix}-{i}", variant.request_id),
            seed_id=variant.seed_id,
            origin="variant",
            strategy=variant.strategy,
            prompt=variant.prompt,
            response=f"answer {i}",
            structured=None,
            logprobs=logprobs if with_logprobs else None,
        )
        for i, variant in enumerate(variants)
    ]


def quarantined(n: int) -> list[QuarantineRow]:
    return [
        QuarantineRow(
            request_id=None,
            input_id=None,
            model=None,
            digest_sha256=None,
            stage="input",
            source_file="inbox/bad.jsonl",
            line=i + 1,
            reason="missing field 'prompt'",
            raw='{"id": 1}',
            created_at=CREATED_AT,
        )
        for i in range(n)
    ]


def seeds(n: int) -> list[SeedRow]:
    """`n` landed seed rows of one input file."""
    return [
        SeedRow(
            input_id=f"seed-{i}",
            messages=[SeedMessage(role="user", content=f"Question {i}?")],
            prompt=f"Question {i}?",
            instructions=None,
            source_file="seeds.jsonl",
            line=i + 1,
            input_sha256="0" * 64,
            created_at=CREATED_AT,
        )
        for i in range(n)
    ]
