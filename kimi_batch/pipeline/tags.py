"""What a request is, in its stage's terms: the typed `RequestTag`, and its one wire form.

The engine carries a request's tag as an opaque string (`GenerationRequest.tag`) into its result
and the ledger; only this module writes or reads that string. The wire forms of amplify and
distill are the ones ledgers already hold (a ledger key never depends on the tag, but
`kimi-batch status` counts ledger rows per table by it):

    amplify  seed, strategy S   ->  "S"              (e.g. "paraphrase")
    distill  seed               ->  "seed"
    distill  variant of S       ->  "variant:S"
    any other stage             ->  "STAGE/ORIGIN" or "STAGE/ORIGIN:S"
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

AMPLIFY_STAGE = "amplify"
DISTILL_STAGE = "distill"

Origin = Literal["seed", "variant"]


class Strategy(StrEnum):
    """How a variant relates to its seed; the value is the `strategy` column."""

    PARAPHRASE = "paraphrase"
    HARDER = "harder"
    RELATED = "related"


_STRATEGIES = frozenset(strategy.value for strategy in Strategy)
_SEED = "seed"
_STAGE = re.compile(r"^[a-z_][a-z0-9_]*$")
_VARIANT_PREFIX = "variant:"


class RequestTag(BaseModel):
    """The stage a request belongs to, and what its input was (a seed, or a variant of one)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stage: str = Field(pattern=_STAGE.pattern, description="The stage's `name`.")
    origin: Origin = Field(default="seed", description="The input: a seed or a variant.")
    strategy: Strategy | None = Field(
        default=None, description="Amplify: the strategy asked for; distill: the variant's."
    )

    @property
    def wire(self) -> str:
        """The string the engine carries (`GenerationRequest.tag`)."""
        strategy = self.strategy.value if self.strategy else None
        if self.stage == AMPLIFY_STAGE and self.origin == "seed" and strategy:
            return strategy
        if self.stage == DISTILL_STAGE and self.origin == "seed" and strategy is None:
            return _SEED
        if self.stage == DISTILL_STAGE and self.origin == "variant" and strategy:
            return f"{_VARIANT_PREFIX}{strategy}"
        return f"{self.stage}/{self.origin}" + (f":{strategy}" if strategy else "")

    @classmethod
    def parse(cls, wire: str) -> RequestTag:
        """The tag of a wire string; ValueError on a string no stage writes."""
        if wire == _SEED:
            return cls(stage=DISTILL_STAGE)
        if wire.startswith(_VARIANT_PREFIX):
            strategy = wire.removeprefix(_VARIANT_PREFIX)
            if strategy in _STRATEGIES:
                return cls(stage=DISTILL_STAGE, origin="variant", strategy=Strategy(strategy))
        elif wire in _STRATEGIES:
            return cls(stage=AMPLIFY_STAGE, strategy=Strategy(wire))
        elif "/" in wire:
            stage, _, rest = wire.partition("/")
            origin, _, strategy = rest.partition(":")
            known = origin in ("seed", "variant") and (not strategy or strategy in _STRATEGIES)
            if known and _STAGE.fullmatch(stage):
                return cls.model_validate(
                    {"stage": stage, "origin": origin, "strategy": strategy or None}
                )
        raise ValueError(f"not a request tag: {wire!r}")
