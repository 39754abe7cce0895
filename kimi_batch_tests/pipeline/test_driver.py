"""The partition driver without a server: the nightly run's ranks (the oldest day first, whatever
order the config lists); a partition that cannot be planned fails alone."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, cast

import pytest

from kimi_batch.engine import BatchOutcome, GenerationResult
from kimi_batch.pipeline import (
    DistillTask,
    GenerationTask,
    HeldPartition,
    PartitionResult,
    PartitionSkippedError,
    PipelineStage,
    StagePlan,
    drive,
    oldest_first,
    plan_partition,
)
from kimi_batch_tests.support.rows import amplified, seeds


def test_the_oldest_partition_gets_rank_zero_whatever_the_listed_order() -> None:
    listed = ["2024-05-03|north", "2024-05-01|south", "2024-05-02|north", "2024-05-01|north"]

    assert oldest_first(listed) == {
        "2024-05-01|north": 0,
        "2024-05-01|south": 1,
        "2024-05-02|north": 2,
        "2024-05-03|north": 3,
    }


class _SessionOpenedError(Exception):
    """Raised by the stand-in session: the run got as far as sending requests."""


@dataclass
class _PlanOnly:
    """A `DriverRun` whose partitions plan from in-memory tables; its session only says it
    was opened (nothing here sends a request)."""

    tables: dict[str, dict[str, list[Any]]]

    def log(self, message: str) -> None:
        pass

    def plan(self, task: GenerationTask[Any, Any], key: str) -> StagePlan:
        ds, source = key.split("|")
        return plan_partition(task, lambda table, _model: self.tables[key][table], ds, source, "s")

    def session(self, label: str) -> AbstractAsyncContextManager[Any]:
        raise _SessionOpenedError(label)

    def land(
        self,
        asset: str,
        key: str,
        plan: StagePlan,
        held: HeldPartition,
        outcome: BatchOutcome,
        results: Iterable[GenerationResult],
    ) -> None:
        raise AssertionError("nothing is sent, so nothing lands")


def _drive(tables: dict[str, dict[str, list[Any]]]) -> dict[str, PartitionResult[None]]:
    stages = [PipelineStage("distilled_responses", DistillTask())]
    held = dict.fromkeys(tables, cast(HeldPartition, None))  # the stand-in takes no lease
    with ThreadPoolExecutor(1) as lands:
        return asyncio.run(drive(_PlanOnly(tables), stages, held, lands=lands, label="night"))


def test_a_partition_amplified_from_an_older_input_waits_the_others_are_sent() -> None:
    """Its seeds re-landed with new ids while its amplification was skipped: its variants name
    seeds that are gone. It fails alone, saying so; it ended the whole night before."""
    rewritten = [s.model_copy(update={"input_id": f"new-{i}"}) for i, s in enumerate(seeds(2))]
    stale = {"seeds": rewritten, "amplified": amplified(2)}
    (result,) = _drive({"2025-06-01|rewritten": stale}).values()
    assert isinstance(result.failed, PartitionSkippedError)
    assert "older version of its input" in str(result.failed)
    good = {"seeds": seeds(2), "amplified": amplified(2)}
    with pytest.raises(_SessionOpenedError):  # the good partition's requests go out
        _drive({"2025-06-01|good": good, "2025-06-01|rewritten": stale})
