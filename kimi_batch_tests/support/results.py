"""Hand-built engine results for the server-free tests of tasks and the ledger."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from kimi_batch.engine.generation import GenerationResult

__all__ = ["CREATED", "chat_body", "make_result"]

CREATED = datetime(2025, 1, 1, tzinfo=UTC)


def make_result(text: str = "answer", **overrides: Any) -> GenerationResult:
    """A finished result with plausible token counts; any field can be overridden."""
    fields: dict[str, Any] = {
        "request_id": "r1",
        "input_id": "s1",
        "tag": "paraphrase",
        "model": "smollm2",
        "digest_sha256": "d" * 64,
        "text": text,
        "finish_reason": "stop",
        "prompt_tokens": 120,
        "cached_tokens": 100,
        "completion_tokens": 12,
        "prompt_ms": 5.0,
        "predicted_ms": 40.0,
        "latency_ms": 50.0,
        "endpoint": "http://127.0.0.1:8081",
        "slot_id": 0,
        "logprobs": None,
        "created_at": CREATED,
    }
    fields.update(overrides)
    return GenerationResult(**fields)


def chat_body(
    text: str = "hi", *, finish_reason: str = "stop", reasoning: str | None = None
) -> dict[str, Any]:
    """A `/v1/chat/completions` body as llama.cpp sends it: 25 of 30 prompt tokens cached."""
    message: dict[str, Any] = {"content": text}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    return {
        "choices": [{"index": 0, "finish_reason": finish_reason, "message": message}],
        "usage": {"prompt_tokens": 30, "completion_tokens": 2, "total_tokens": 32},
        "timings": {
            "cache_n": 25,
            "prompt_n": 5,
            "prompt_ms": 10.0,
            "predicted_n": 2,
            "predicted_ms": 4.0,
        },
    }
