"""Output models a run may constrain distillation answers to (`distilled_responses.output_model`).

Run config names a model as `module:Name`; only modules the deployment allows are imported
(this one, plus KIMI_BATCH_OUTPUT_MODEL_MODULES), so a launchpad user cannot import arbitrary
code. Add a team's own schemas in its own module and allow it there.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field


def import_output_model(path: str, allowed: Sequence[str]) -> type[BaseModel]:
    """The pydantic model `module:Name`, imported only from an allowed module; else ValueError."""
    module_name, _, name = path.partition(":")
    if not any(module_name == m or module_name.startswith(m + ".") for m in allowed):
        raise ValueError(
            f"output_model {path!r} is not in an allowed module ({', '.join(allowed)}); "
            "extend KIMI_BATCH_OUTPUT_MODEL_MODULES in the deployment"
        )
    try:
        found = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError) as error:
        raise ValueError(f"output_model {path!r} cannot be imported: {error}") from error
    if not (isinstance(found, type) and issubclass(found, BaseModel)):
        raise ValueError(f"output_model {path!r} is not a pydantic model")
    return found


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
