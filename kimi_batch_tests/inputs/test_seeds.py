"""kimi_batch.inputs.prompts: a seed through the `seeds` table and back keeps what it asks."""

from __future__ import annotations

from kimi_batch.inputs.prompts import ParamOverrides, SeedPrompt, seed_rows, seeds_from_rows
from kimi_batch_tests.support.rows import CREATED_AT

_TOOLS = [{"type": "function", "function": {"name": "get_weather"}}]


def test_a_seed_s_tools_survive_the_seeds_table() -> None:
    seeds = [
        SeedPrompt.model_validate(
            {
                "input_id": name,
                "messages": [{"role": "user", "content": "Weather?"}],
                "prompt": "Weather?",
                "instructions": None,
                "params": ParamOverrides(tools=tools, max_tokens=8),
                "source_file": "in.jsonl",
                "line": 1,
            }
        )
        for name, tools in (("tools", _TOOLS), ("none", None))
    ]
    rows = seed_rows(seeds, input_sha256="0" * 64, created_at=CREATED_AT)
    assert rows[0].tools is not None
    assert rows[1].tools is None
    assert seeds_from_rows(rows) == seeds
