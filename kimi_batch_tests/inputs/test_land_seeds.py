"""Landing seeds: a row the table cannot hold is set aside, never the whole partition's write
(issue 42, item 8)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from kimi_batch.inputs.prompts import InputBatch, ParamOverrides, SeedPrompt
from kimi_batch.inputs.reader import InputReader
from kimi_batch.inputs.seeds import ChunkReader, land_seeds
from kimi_batch.llama import ChatMessage
from kimi_batch.pipeline import QuarantineRow
from kimi_batch.warehouse import Warehouse
from kimi_batch_tests.support.rows import CREATED_AT


def _seed(
    input_id: str, *, seed: int | None = None, tools: list[dict[str, Any]] | None = None
) -> SeedPrompt:
    return SeedPrompt(
        input_id=input_id,
        messages=[ChatMessage(role="user", content=f"Prompt {input_id}")],
        prompt=f"Prompt {input_id}",
        instructions=None,
        params=ParamOverrides(seed=seed, tools=tools),
        source_file="night.jsonl",
        line=int(input_id),
    )


class _Reader:
    """A reader that hands over seeds past validation (as a reader of a later version might)."""

    def __init__(self, seeds: list[SeedPrompt]) -> None:
        self.seeds = seeds

    def chunks(self, path: Path, /) -> Iterator[InputBatch]:
        yield InputBatch(seeds=self.seeds, quarantined=[])


def _all_fit(seeds: Sequence[SeedPrompt]) -> InputBatch:
    return InputBatch(seeds=list(seeds), quarantined=[])


def _land(
    tmp_path: Path, reader: ChunkReader, set_aside: list[QuarantineRow]
) -> tuple[Warehouse, int]:
    warehouse = Warehouse(tmp_path / "warehouse")
    written = land_seeds(
        warehouse,
        "2026-12-01",
        "night",
        snapshot=tmp_path / "night.jsonl",
        reader=reader,
        input_sha256="0" * 64,
        check_lengths=_all_fit,
        now=CREATED_AT,
        set_aside=set_aside,
    )
    return warehouse, written.rows


def test_a_seed_past_64_bits_is_set_aside_and_the_rest_written(tmp_path: Path) -> None:
    set_aside: list[QuarantineRow] = []
    seeds = [_seed("1"), _seed("2", seed=18446744073709551615), _seed("3", seed=7)]

    warehouse, rows = _land(tmp_path, _Reader(seeds), set_aside)

    frame = warehouse.read_partition("seeds", "2026-12-01", "night")
    assert rows == 2
    assert frame["input_id"].to_list() == ["1", "3"]
    assert frame["seed"].to_list() == [None, 7]
    [row] = set_aside
    assert (row.input_id, row.line, row.stage) == ("2", 2, "input")
    assert row.reason == "seed: must be a 64-bit integer (the table stores it as BIGINT)"


_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather."}}


def test_a_seed_with_a_lone_surrogate_is_set_aside_and_the_rest_written(tmp_path: Path) -> None:
    """A string that is not valid Unicode past validation would fail the table's UTF-8 write."""
    set_aside: list[QuarantineRow] = []
    bad_tool = {"type": "function", "function": {"name": "f", "description": "bad \ud800"}}
    seeds = [_seed("1", tools=[_TOOL]), _seed("2", tools=[bad_tool]), _seed("3")]

    warehouse, rows = _land(tmp_path, _Reader(seeds), set_aside)

    frame = warehouse.read_partition("seeds", "2026-12-01", "night")
    assert rows == 2
    assert frame["input_id"].to_list() == ["1", "3"]
    assert json.loads(frame["tools"][0]) == [_TOOL]
    [row] = set_aside
    assert (row.input_id, row.line, row.stage) == ("2", 2, "input")
    assert row.reason.startswith("tools: has a lone surrogate '\\ud800' at character ")


def test_an_inbox_row_whose_tool_is_not_unicode_is_quarantined_and_the_rest_land(
    tmp_path: Path,
) -> None:
    """The row has its own `id`, so no content hash encodes its tools before the write."""
    inbox = tmp_path / "night.jsonl"
    rows = [
        {"id": "a", "prompt": "Weather?", "tools": [_TOOL]},
        {
            "id": "b",
            "prompt": "Weather?",
            "tools": [{**_TOOL, "function": {"name": "f", "description": "bad \ud800"}}],
        },
        {"id": "c", "prompt": "Plain."},
    ]
    inbox.write_text("".join(json.dumps(row) + "\n" for row in rows))
    set_aside: list[QuarantineRow] = []

    warehouse, landed = _land(
        tmp_path, InputReader(source_name="night.jsonl", now=CREATED_AT), set_aside
    )

    assert landed == 2
    frame = warehouse.read_partition("seeds", "2026-12-01", "night")
    assert frame["input_id"].to_list() == ["a", "c"]
    [row] = set_aside
    assert row.line == 2
    assert row.reason.startswith("tools[0].function.description: has a lone surrogate '\\ud800'")
