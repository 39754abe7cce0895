"""Landing seeds: a row the table cannot hold is set aside, never the whole partition's write
(issue 42, item 8)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

from kimi_batch.inputs.prompts import InputBatch, ParamOverrides, SeedPrompt
from kimi_batch.inputs.seeds import land_seeds
from kimi_batch.llama import ChatMessage
from kimi_batch.pipeline import QuarantineRow
from kimi_batch.warehouse import Warehouse
from kimi_batch_tests.support.rows import CREATED_AT


def _seed(input_id: str, *, seed: int | None = None) -> SeedPrompt:
    return SeedPrompt(
        input_id=input_id,
        messages=[ChatMessage(role="user", content=f"Prompt {input_id}")],
        prompt=f"Prompt {input_id}",
        instructions=None,
        params=ParamOverrides(seed=seed),
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


def test_a_seed_past_64_bits_is_set_aside_and_the_rest_written(tmp_path: Path) -> None:
    warehouse = Warehouse(tmp_path / "warehouse")
    set_aside: list[QuarantineRow] = []
    seeds = [_seed("1"), _seed("2", seed=18446744073709551615), _seed("3", seed=7)]

    written = land_seeds(
        warehouse,
        "2026-12-01",
        "night",
        snapshot=tmp_path / "night.jsonl",
        reader=_Reader(seeds),
        input_sha256="0" * 64,
        check_lengths=_all_fit,
        now=CREATED_AT,
        set_aside=set_aside,
    )

    frame = warehouse.read_partition("seeds", "2026-12-01", "night")
    assert written.rows == 2
    assert frame["input_id"].to_list() == ["1", "3"]
    assert frame["seed"].to_list() == [None, 7]
    [row] = set_aside
    assert (row.input_id, row.line, row.stage) == ("2", 2, "input")
    assert row.reason == "seed: must be a 64-bit integer (the table stores it as BIGINT)"
