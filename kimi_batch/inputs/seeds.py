"""Seed prompts as rows of the `seeds` table, and back: the landed form every downstream step reads."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import datetime

from kimi_batch.inputs.prompts import ParamOverrides, SeedPrompt
from kimi_batch.llama import ChatMessage
from kimi_batch.pipeline import SeedMessage, SeedRow


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
