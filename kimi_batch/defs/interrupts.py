"""The event loop of a llama step, stopped for certain by a terminated run
(`pipeline/interrupts.py`), raising Dagster's own interrupt once the loop has stopped."""

from __future__ import annotations

from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import dagster as dg

from kimi_batch.pipeline import InterruptibleRunner
from kimi_batch.pipeline import interruptible_runner as pipeline_runner

T = TypeVar("T")


@contextmanager
def interruptible_runner() -> Iterator[InterruptibleRunner]:
    """`asyncio.Runner()` for a Dagster step; closed on exit."""
    with pipeline_runner(dg.DagsterExecutionInterruptedError) as runner:
        yield runner


def run_interruptibly(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run` for a Dagster step: a terminated run cancels `main`."""
    with interruptible_runner() as runner:
        return runner.run(main)
