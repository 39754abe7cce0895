"""The target's speeds: one model the stand-in runs on and `plan` predicts with.

Kimi-K2.5 Q4 on the 16-core EPYC 9175F (13-14 threads, CPU only), fitted from the source
document's measurements with a per-token cost that grows linearly with the context position (the
attention over the KV already in the slot):

- prefill: 0.0386 s + 1.54e-5 s x position per token. 823 tokens take 37 s (measured 22.2 tok/s),
  16,148 tokens 2,626 s = 44 min (measured 6.15 tok/s), a short prompt at 16.5k context 3.4 tok/s
  (measured 3.1-3.4).
- decode: 0.0759 s + 2.15e-5 s x position per token: 10.2 tok/s over a 438-token answer after an
  823-token prompt (measured 10.27), 8.7 after 1,335 tokens (8.76), 2.35 over 333 tokens after
  16,148 (2.44: the document's "2.4 tok/s at ctx=32k" is this run, a 32k server holding 16.5k
  tokens). The document's 19.6 tok/s is the GPU-hybrid build (attention on a GPU), not this target.
- slots decoding together share one pass over the weights per step, but a MoE step with more
  tokens reads more experts: a step of n slots costs (1 + 0.6 (n - 1)) weight passes plus each
  slot's attention (`batch_decode_factor`; an assumption, the documents measure one stream).
- restoring a saved slot: 62 ms (the measured cache lookup).

A llama.cpp step holds every slot: while one slot evaluates its prompt the others wait, so a
round of n slots that start together costs n prompt evaluations plus their decode steps in
lockstep (`round_s`).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["TargetProfile"]


class TargetProfile(BaseModel):
    """Per-token costs of the target in seconds; see the module docstring for the fit."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "kimi-k2.5-q4-epyc-9175f-th13"
    prefill_s: float = Field(default=0.03864, gt=0, description="Prompt token at position 0.")
    prefill_s_per_ctx: float = Field(default=1.5356e-5, ge=0)
    decode_s: float = Field(default=0.0759, gt=0, description="Generated token at position 0.")
    decode_s_per_ctx: float = Field(default=2.146e-5, ge=0)
    batch_decode_factor: float = Field(
        default=0.6, ge=0, le=1, description="Weight-pass cost of each extra decoding slot."
    )
    restore_s: float = Field(default=0.062, ge=0)
    n_batch: int = Field(default=2048, ge=32, description="Tokens of one step (--batch-size).")

    def prefill_cost(self, position: int, tokens: int) -> float:
        """Seconds to evaluate `tokens` prompt tokens starting at context `position`."""
        return tokens * self.prefill_s + self.prefill_s_per_ctx * (
            position * tokens + tokens * tokens / 2
        )

    def decode_step_cost(self, positions: list[int]) -> float:
        """Seconds of one decode step of the slots at these context positions."""
        weights = self.decode_s * (1 + self.batch_decode_factor * (len(positions) - 1))
        return weights + self.decode_s_per_ctx * sum(positions)

    def decode_cost(self, position: int, tokens: int, slots: int = 1) -> float:
        """Seconds for `slots` slots in lockstep to generate `tokens` each from `position` on:
        the sum of the decode steps as the context grows by one token a step."""
        weights = self.decode_s * (1 + self.batch_decode_factor * (slots - 1))
        growth = position * tokens + tokens * (tokens - 1) / 2
        return tokens * weights + self.decode_s_per_ctx * slots * growth

    def round_s(self, context: int, prompt: int, output: int, slots: int) -> float:
        """Seconds of one round: `slots` rows started together, each `prompt` tokens evaluated
        after `context` cached ones (the digest), then `output` tokens generated in lockstep."""
        if slots <= 0:
            return 0.0
        return slots * self.prefill_cost(context, prompt) + self.decode_cost(
            context + prompt, output, slots
        )
