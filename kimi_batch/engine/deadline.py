"""How long one request may take: from the work it carries and the speeds measured so far.

On the target a 16k-token prompt legitimately takes ~44 minutes and a 1,024-token answer at 32k
context ~7, so a fixed short timeout would kill good work and a fixed long one lets a hung server
hold a slot for hours. The deadline is the request's own work at the measured speeds, times a
safety multiplier, never under a generous floor.
"""

from __future__ import annotations

import math
import time

from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.engine.generation import GenerationResult
from kimi_batch.engine.speeds import MeasuredSpeeds, SpeedStore
from kimi_batch.llama import ChatMessage

# Chat-template tokens around each message (role markers, separators): a generous allowance.
_TEMPLATE_TOKENS_PER_MESSAGE = 16
# Samples smaller than this say more about overhead than about speed.
_MIN_PROMPT_SAMPLE = 32
_MIN_DECODE_SAMPLE = 8
_EWMA = 0.3


class DeadlinePolicy(BaseModel):
    """Per-request deadline = max(floor, multiplier x (prompt to evaluate / prompt speed +
    max_tokens / decode speed)). Initial speeds are the target's slow end, used until measured."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    floor_s: float = Field(default=600.0, gt=0, description="No request is cut before this.")
    multiplier: float = Field(default=3.0, ge=1.0, description="Safety factor on the estimate.")
    prompt_tok_s: float = Field(
        default=5.0, gt=0, description="Prefill speed per request until measured (target ~6)."
    )
    decode_tok_s: float = Field(
        default=1.0, gt=0, description="Decode speed per request until measured (target 2-20)."
    )
    chars_per_token: float = Field(
        default=3.0, gt=0, description="Prompt-size estimate; low (English is ~4) to err long."
    )


def estimate_prompt_tokens(messages: list[ChatMessage], chars_per_token: float) -> int:
    """Tokens of the user-side messages (the digest is cached, so it is not counted)."""
    chars = sum(len(message.content) for message in messages)
    return math.ceil(chars / chars_per_token) + _TEMPLATE_TOKENS_PER_MESSAGE * len(messages)


def _speed(tokens: int, ms: float) -> float | None:
    """Tokens per second of a sample; None when that is no finite positive number.

    A server's timings are whatever it sends (the ledger keeps any non-negative finite float):
    a duration that is zero in seconds (a subnormal ms underflows) raised ZeroDivisionError, an
    infinite one made a speed of 0 that every later deadline divided by, and a count past any
    float raised OverflowError, each inside the engine's recording, ending the run. Such a
    sample says nothing about speed, as one below the minimums."""
    try:
        speed = tokens / (ms / 1000)
    except (ZeroDivisionError, OverflowError):
        return None
    return speed if 0 < speed < math.inf else None


class SpeedTracker:
    """Prompt and decode speeds per request, updated from finished requests (moving average).

    With a `store`, it starts from the speeds last measured for `model` (another step, another
    run) and keeps what it measures there."""

    def __init__(
        self, policy: DeadlinePolicy, *, store: SpeedStore | None = None, model: str = ""
    ) -> None:
        self.policy = policy
        self.prompt_tok_s = policy.prompt_tok_s
        self.decode_tok_s = policy.decode_tok_s
        self._prompt_seen = False
        self._decode_seen = False
        self._store = store
        self._model = model
        if store is not None:
            last = store.load(model)
            if last.prompt_tok_s is not None:
                self.prompt_tok_s, self._prompt_seen = last.prompt_tok_s, True
            if last.decode_tok_s is not None:
                self.decode_tok_s, self._decode_seen = last.decode_tok_s, True

    def observe(self, result: GenerationResult) -> None:
        evaluated = result.prompt_tokens - result.cached_tokens
        self.observe_prompt(evaluated, result.prompt_ms, keep=False)
        if (
            result.completion_tokens >= _MIN_DECODE_SAMPLE
            and result.predicted_ms > 0
            and (speed := _speed(result.completion_tokens, result.predicted_ms)) is not None
        ):
            self.decode_tok_s = self._blend(self.decode_tok_s, speed, self._decode_seen)
            self._decode_seen = True
        self.keep(force=False)

    def observe_prompt(self, tokens: int, ms: float, *, keep: bool = True) -> None:
        """A prompt evaluation: a request's, or the digest prefill's (the longest there is)."""
        if tokens >= _MIN_PROMPT_SAMPLE and ms > 0 and (speed := _speed(tokens, ms)) is not None:
            self.prompt_tok_s = self._blend(self.prompt_tok_s, speed, self._prompt_seen)
            self._prompt_seen = True
            if keep:
                self.keep()

    def keep(self, *, force: bool = True) -> None:
        """Write what was measured to the store (unforced: at most every few seconds)."""
        if self._store is None or not (self._prompt_seen or self._decode_seen):
            return
        self._store.save(
            self._model,
            MeasuredSpeeds(
                prompt_tok_s=self.prompt_tok_s if self._prompt_seen else None,
                decode_tok_s=self.decode_tok_s if self._decode_seen else None,
                measured_at=time.time(),
            ),
            force=force,
        )

    @property
    def measured_prompt_tok_s(self) -> float | None:
        """The prompt speed measured so far; None while only the initial guess is known."""
        return self.prompt_tok_s if self._prompt_seen else None

    @staticmethod
    def _blend(current: float, sample: float, seen: bool) -> float:
        # The first measurement replaces the guess; later ones move the average.
        return sample if not seen else (1 - _EWMA) * current + _EWMA * sample

    def deadline_s(self, prompt_tokens: int, max_tokens: int) -> float:
        """Seconds one request may take: `prompt_tokens` still to evaluate, `max_tokens` out."""
        estimate = prompt_tokens / self.prompt_tok_s + max_tokens / self.decode_tok_s
        return max(self.policy.floor_s, self.policy.multiplier * estimate)
