"""A finished request as the ledger keeps it."""

from __future__ import annotations

from datetime import UTC, datetime

from kimi_batch.engine.generation import GenerationResult
from kimi_batch.engine.outcome import PlannedRequest
from kimi_batch.llama import ChatCompletion


def completion_result(
    item: PlannedRequest,
    completion: ChatCompletion,
    *,
    model: str,
    digest_sha256: str,
    endpoint: str,
    slot_id: int,
    latency_ms: float,
) -> GenerationResult:
    """The ledger row of `item` (keyed by its content key). Truncated and empty answers are kept
    as they are (finish_reason says which): what counts as final is the stage's decision."""
    stats = completion.stats
    return GenerationResult(
        request_id=item.content_key,
        input_id=item.request.input_id,
        tag=item.request.tag,
        model=model,
        digest_sha256=digest_sha256,
        text=completion.text,
        finish_reason=completion.finish_reason,
        prompt_tokens=stats.prompt_tokens,
        cached_tokens=stats.cached_tokens,
        completion_tokens=stats.completion_tokens,
        prompt_ms=stats.prompt_ms,
        predicted_ms=stats.predicted_ms,
        latency_ms=latency_ms,
        endpoint=endpoint,
        slot_id=slot_id,
        logprobs=completion.logprobs,
        created_at=datetime.now(UTC),
        reasoning_content=completion.reasoning_content,
        draft_tokens=stats.draft_tokens,
        draft_accepted_tokens=stats.draft_accepted_tokens,
        tool_calls=completion.tool_calls,
    )
