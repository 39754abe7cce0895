"""One attempt of one request: sent to its own slot, bounded by its deadline, and cancelled by
the watchdog when its endpoint hangs (then it raises `EndpointHungError`). A chat request goes
out after the digest; a completion request is its raw prompt alone."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

from kimi_batch.engine.digest import SystemDigest
from kimi_batch.engine.outcome import PlannedRequest
from kimi_batch.engine.prompt import assemble_messages
from kimi_batch.engine.watchdog import EndpointWatch
from kimi_batch.llama import (
    ChatCompletion,
    LlamaConnectionError,
    LlamaLoadingError,
    LlamaResponseError,
    LlamaServerError,
    LlamaTimeoutError,
)


class EndpointHungError(LlamaTimeoutError):
    """The watchdog cancelled this send: the endpoint made no progress for a stall period."""


# Worth another attempt. A respawned server answers 503 while it loads the model: that is a
# wait, not a failure.
TRANSIENT = (
    LlamaConnectionError,
    LlamaLoadingError,
    LlamaServerError,
    LlamaTimeoutError,
    LlamaResponseError,
)


class InFlight:
    """Requests in flight on all endpoints now, and the most there ever were."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0

    def enter(self) -> None:
        self.now += 1
        self.peak = max(self.peak, self.now)

    def leave(self) -> None:
        self.now -= 1


def _generation(
    watch: EndpointWatch,
    slot_id: int,
    item: PlannedRequest,
    *,
    digest: SystemDigest,
    deadline_s: float,
) -> Coroutine[Any, Any, ChatCompletion]:
    """The client call of this request: its raw prompt as it is, or its messages after the
    digest."""
    params, request = item.params, item.request
    if request.kind == "completion":
        return watch.client.text_completion(
            request.raw_prompt,
            max_tokens=params.max_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            seed=params.seed,
            slot_id=slot_id,
            logprobs=params.n_probs,
            extras=params.extras(),
            timeout_s=deadline_s,
        )
    return watch.client.chat(
        assemble_messages(digest, request.messages),
        max_tokens=params.max_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        seed=params.seed,
        slot_id=slot_id,
        top_logprobs=params.n_probs,
        json_schema=params.json_schema,
        extras=params.extras(),
        timeout_s=deadline_s,
    )


async def send_once(
    watch: EndpointWatch,
    slot_id: int,
    item: PlannedRequest,
    *,
    digest: SystemDigest,
    deadline_s: float,
    flight: InFlight,
) -> ChatCompletion:
    """One attempt on `slot_id` of the watched endpoint, after any restart of it is over."""
    flight.enter()
    try:
        task = await watch.watched(
            slot_id, _generation(watch, slot_id, item, digest=digest, deadline_s=deadline_s)
        )
    finally:
        flight.leave()
    if task.cancelled():
        raise EndpointHungError(f"{watch.base_url} made no progress ({watch.describe_stall()})")
    return task.result()
