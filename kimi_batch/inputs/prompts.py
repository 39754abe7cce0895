"""The domain of input rows: a validated seed prompt, its sampling overrides, a chunk of them,
and seed prompts as rows of the `seeds` table and back (the landed form every downstream step
reads).

Reading files is `reader` (formats in `formats`, what users may write in `raw_rows`);
quarantine rows are built in `pipeline.rows`; length checks are in `pipeline.prompt_length`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kimi_batch.engine import SamplingParams
from kimi_batch.llama import ChatMessage
from kimi_batch.pipeline import QuarantineRow, SeedMessage, SeedRow

# ---- seed prompts -------------------------------------------------------------------------------


class ParamOverrides(BaseModel):
    """Per-row sampling overrides; unset fields keep the run's defaults."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_tokens: int | None = Field(default=None, gt=0)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    seed: int | None = None
    tools: list[dict[str, Any]] | None = Field(
        default=None, description="OpenAI function tools the row's request offers."
    )

    def apply(self, base: SamplingParams) -> SamplingParams:
        """`base` with the fields this row sets replaced (validated again as SamplingParams)."""
        return SamplingParams.model_validate(
            {**base.model_dump(), **self.model_dump(exclude_none=True)}
        )


class SeedPrompt(BaseModel):
    """One validated input row: what is sent (user side only) and where it came from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input_id: str = Field(min_length=1, description="Row `id`/`custom_id`, else a content hash.")
    messages: list[ChatMessage] = Field(
        min_length=1, description="User side only; instructions folded into the first user turn."
    )
    prompt: str = Field(min_length=1, description="The last user message as written (no block).")
    instructions: str | None = Field(
        default=None, description="The row's own system text, already folded into `messages`."
    )
    params: ParamOverrides = Field(default_factory=ParamOverrides)
    source_file: str
    line: int | None = Field(ge=1, description="1-based line (JSONL/CSV) or row number.")

    @field_validator("messages")
    @classmethod
    def _no_system_role(cls, messages: list[ChatMessage]) -> list[ChatMessage]:
        if any(message.role == "system" for message in messages):
            raise ValueError("system messages are not allowed (the digest is the only system)")
        if messages[-1].role != "user":
            raise ValueError("the last message must be from the user")
        return messages

    def sampling_params(self, base: SamplingParams) -> SamplingParams:
        """The run's params with this row's overrides applied."""
        return self.params.apply(base)


class InputBatch(BaseModel):
    """What one inbox file yielded: good seeds and quarantined rows."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seeds: list[SeedPrompt]
    quarantined: list[QuarantineRow]


# ---- seed prompts as rows of the `seeds` table --------------------------------------------------


def seed_rows(
    seeds: Iterable[SeedPrompt],
    *,
    input_sha256: str,
    created_at: datetime,
    token_counts: Mapping[str, int] | None = None,
) -> list[SeedRow]:
    counts = token_counts or {}
    return [
        SeedRow(
            input_id=seed.input_id,
            prompt_tokens=counts.get(seed.input_id),
            messages=[SeedMessage(role=m.role, content=m.content) for m in seed.messages],
            prompt=seed.prompt,
            instructions=seed.instructions,
            max_tokens=seed.params.max_tokens,
            temperature=seed.params.temperature,
            top_p=seed.params.top_p,
            seed=seed.params.seed,
            tools=json.dumps(seed.params.tools, ensure_ascii=False) if seed.params.tools else None,
            source_file=seed.source_file,
            line=seed.line,
            input_sha256=input_sha256,
            created_at=created_at,
        )
        for seed in seeds
    ]


def seeds_from_rows(rows: Iterable[SeedRow]) -> list[SeedPrompt]:
    return [
        SeedPrompt(
            input_id=row.input_id,
            messages=[
                ChatMessage.model_validate({"role": m.role, "content": m.content})
                for m in row.messages
            ],
            prompt=row.prompt,
            instructions=row.instructions,
            params=ParamOverrides(
                max_tokens=row.max_tokens,
                temperature=row.temperature,
                top_p=row.top_p,
                seed=row.seed,
                tools=json.loads(row.tools) if row.tools else None,
            ),
            source_file=row.source_file,
            line=row.line,
        )
        for row in rows
    ]
