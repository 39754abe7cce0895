"""Planning a stage's partition (no server): every input row that samples is the partition's own
sample, the same on every rerun; a greedy or seeded request is shared across partitions."""

from __future__ import annotations

from pathlib import Path

from kimi_batch.engine import SamplingParams
from kimi_batch.pipeline import AmplifyTask, DistillTask, SeedMessage, SeedRow, Strategy
from kimi_batch.pipeline.driver import plan_stage
from kimi_batch.warehouse import Warehouse
from kimi_batch_tests.support.rows import CREATED_AT

DS = "2024-05-01"


def _same_question(n: int) -> list[SeedRow]:
    """`n` rows of one file asking the same question (ids `s0..`)."""
    return [
        SeedRow(
            input_id=f"s{i}",
            messages=[SeedMessage(role="user", content="Name a colour.")],
            prompt="Name a colour.",
            instructions=None,
            source_file="same.jsonl",
            line=i + 1,
            input_sha256="0" * 64,
            created_at=CREATED_AT,
        )
        for i in range(n)
    ]


def _warehouse(tmp_path: Path) -> Warehouse:
    warehouse = Warehouse(tmp_path / "warehouse")
    for source in ("day_a", "day_b"):
        warehouse.write_partition("seeds", DS, source, _same_question(3))
    return warehouse


def test_identical_rows_that_sample_are_each_the_partition_s_own(tmp_path: Path) -> None:
    warehouse = _warehouse(tmp_path)
    task = DistillTask(params=SamplingParams(temperature=1.0))

    first = [r.sample for r in plan_stage(task, warehouse, DS, "day_a").requests]
    again = [r.sample for r in plan_stage(task, warehouse, DS, "day_a").requests]
    other = [r.sample for r in plan_stage(task, warehouse, DS, "day_b").requests]

    assert len(set(first)) == 3
    assert None not in first
    assert again == first  # a rerun finds them in the ledger
    assert not set(other) & set(first)  # the same rows in another partition: new samples


def test_greedy_rows_share_and_amplify_variants_stay_distinct(tmp_path: Path) -> None:
    warehouse = _warehouse(tmp_path)
    greedy = plan_stage(DistillTask(params=SamplingParams(temperature=0.0)), warehouse, DS, "day_a")
    assert {r.sample for r in greedy.requests} == {None}

    amplify = plan_stage(AmplifyTask(strategies=[Strategy.PARAPHRASE], k=3), warehouse, DS, "day_a")
    # Seeded per seed and variant: determined, and k distinct requests per row.
    assert {r.sample for r in amplify.requests} == {None}
    assert len({(r.messages[0].content, r.params.seed) for r in amplify.requests}) == 9
