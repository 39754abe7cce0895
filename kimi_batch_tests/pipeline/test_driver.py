"""The nightly run's ranks (no server): the oldest day first, whatever order the config lists."""

from __future__ import annotations

from kimi_batch.pipeline import oldest_first


def test_the_oldest_partition_gets_rank_zero_whatever_the_listed_order() -> None:
    listed = ["2024-05-03|north", "2024-05-01|south", "2024-05-02|north", "2024-05-01|north"]

    assert oldest_first(listed) == {
        "2024-05-01|north": 0,
        "2024-05-01|south": 1,
        "2024-05-02|north": 2,
        "2024-05-03|north": 3,
    }
