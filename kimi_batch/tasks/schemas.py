"""Output models a run may constrain distillation answers to (`distilled_responses.output_model`).

Run config names a model as `module:Name`; only modules the deployment allows are imported
(this one, plus KIMI_BATCH_OUTPUT_MODEL_MODULES), so a launchpad user cannot import arbitrary
code. Add a team's own schemas in its own module and allow it there.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ShortAnswer", "StepByStepAnswer"]


class ShortAnswer(BaseModel):
    """A direct answer with the model's confidence."""

    model_config = ConfigDict(extra="forbid")

    answer: str = Field(min_length=1)
    confidence: float = Field(ge=0.0, le=1.0)


class StepByStepAnswer(BaseModel):
    """Reasoning steps, then the final answer (for chain-of-thought distillation)."""

    model_config = ConfigDict(extra="forbid")

    steps: list[str] = Field(min_length=1)
    answer: str = Field(min_length=1)
