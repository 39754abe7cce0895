"""What a slot can hold: the answer budget of a request and the fit of digest + prompt + answer.

llama-server splits `--ctx-size` evenly between its `--parallel` slots, lets a request's
`max_tokens` exceed its own `--n-predict`, and stops an answer only when the slot's context is
full. So the engine caps every request's budget itself: at the server's `n_predict` (or, when the
server reports none, the configured default budget) and at what the slot has left after the
digest. The same sum, checked before a run, tells a user the context is too small for their
digest while it is still a setting, not a night of truncated answers.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.errors import ConfigError

# The prompt a row is allowed besides the digest when no prompt is known yet (the digest prefill,
# `server start`): a question of a few paragraphs.
PROMPT_ALLOWANCE_TOKENS = 256
DEFAULT_REMEDY = (
    "set KIMI_BATCH_LLAMA_CTX to at least {ctx_needed} (or fewer slots, "
    "KIMI_BATCH_LLAMA_PARALLEL, or a smaller answer budget, KIMI_BATCH_LLAMA_N_PREDICT)"
)
# English averages about 4 characters a token in the tokenizers of large models.
CHARS_PER_TOKEN = 4
# The answer room a slot keeps at least, so a cap from the context is never zero.
_MIN_ANSWER_TOKENS = 1


class ContextTooSmallError(ConfigError):
    """Digest + prompt + answer do not fit one slot's share of the server's context."""


class SlotFit(BaseModel):
    """Tokens one request needs in its slot against the slot's share of the context."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    digest_tokens: int = Field(ge=0)
    prompt_tokens: int = Field(ge=0)
    answer_tokens: int = Field(ge=0)
    ctx: int = Field(gt=0, description="The server's whole context (every slot).")
    slots: int = Field(ge=1)
    digest_estimated: bool = Field(
        default=False, description="The digest's tokens estimated from its characters."
    )

    @property
    def slot_ctx(self) -> int:
        return self.ctx // self.slots  # llama.cpp's split

    @property
    def needed(self) -> int:
        return self.digest_tokens + self.prompt_tokens + self.answer_tokens

    @property
    def fits(self) -> bool:
        return self.needed <= self.slot_ctx

    @property
    def ctx_needed(self) -> int:
        """The smallest whole context that holds `needed` in each slot, rounded up to 1,024."""
        return -(-self.needed * self.slots // 1024) * 1024

    def check(self, remedy: str = DEFAULT_REMEDY) -> SlotFit:
        """Itself when it fits; else `ContextTooSmallError` with the numbers and `remedy`, which
        may name `{ctx_needed}` (for an attached server: the flag to start it with)."""
        if not self.fits:
            advice = remedy.format(ctx_needed=str(self.ctx_needed))
            raise ContextTooSmallError(f"a slot cannot hold {self.describe()}: {advice}")
        return self

    def describe(self) -> str:
        return (
            f"digest {'~' if self.digest_estimated else ''}{self.digest_tokens:,} + prompt {self.prompt_tokens:,} + answer "
            f"{self.answer_tokens:,} = {self.needed:,} tokens, a slot holds {self.slot_ctx:,} "
            f"(context {self.ctx:,} over {self.slots} slots)"
        )


def check_fit(
    *,
    digest_tokens: int,
    prompt_tokens: int,
    answer_tokens: int,
    ctx: int,
    slots: int,
    digest_estimated: bool = False,
    remedy: str = DEFAULT_REMEDY,
) -> SlotFit:
    """The fit of one request in a slot; raises `ContextTooSmallError` when it does not fit."""
    return SlotFit(
        digest_tokens=digest_tokens,
        prompt_tokens=prompt_tokens,
        answer_tokens=answer_tokens,
        ctx=ctx,
        slots=slots,
        digest_estimated=digest_estimated,
    ).check(remedy)


def estimate_tokens(text: str) -> int:
    """Tokens of English text before a tokenizer is at hand (a server not started yet)."""
    return -(-len(text) // CHARS_PER_TOKEN)


def answer_cap(*, n_predict: int, slot_ctx: int | None, digest_tokens: int) -> int | None:
    """The largest `max_tokens` worth sending: the server's `n_predict` (when > 0) and the slot's
    context after the digest, whichever is smaller; None when neither is known."""
    caps = [n_predict] if n_predict > 0 else []
    if slot_ctx:
        caps.append(max(_MIN_ANSWER_TOKENS, slot_ctx - digest_tokens))
    return min(caps, default=None)
