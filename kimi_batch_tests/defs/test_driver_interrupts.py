"""A terminated run's interrupt always stops the event loop of its step, wherever it lands.

Dagster delivers a terminate as SIGINT to the step process; these tests send it to this process
the same way (`os.kill`), under Dagster's own handler (`raise_execution_interrupts`), at the
places where a plain `asyncio.run` loses it: inside a loop callback and inside a task that
nobody awaits yet.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable

import dagster as dg
import pytest

from kimi_batch.defs.assets.stage_asset import interruptible_runner, run_interruptibly


def _interrupt_self(signo: int = signal.SIGINT) -> None:
    os.kill(os.getpid(), signo)


class Work:
    """A coroutine with a task of its own; records how each of them ended."""

    def __init__(self, interrupt: Callable[[], None], *, wait_s: float = 30.0) -> None:
        self.interrupt = interrupt
        self.wait_s = wait_s
        self.ended: dict[str, str] = {}

    async def _side(self) -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            self.ended["side"] = "cancelled"
            raise

    async def main(self) -> str:
        side = asyncio.create_task(self._side())  # never awaited: left to the runner
        await asyncio.sleep(0)
        self.interrupt()
        try:
            await asyncio.sleep(self.wait_s)
        except asyncio.CancelledError:
            self.ended["main"] = "cancelled"
            raise
        side.cancel()
        return "ran to the end"


def in_a_callback() -> None:
    asyncio.get_running_loop().call_soon(_interrupt_self)


def in_a_task() -> None:
    async def send() -> None:
        _interrupt_self()

    asyncio.get_running_loop().create_task(send())


def in_the_coroutine() -> None:
    _interrupt_self()


@pytest.mark.parametrize("interrupt", [in_a_callback, in_a_task, in_the_coroutine])
def test_an_interrupt_anywhere_in_the_loop_cancels_every_task_and_reaches_dagster(
    interrupt: Callable[[], None],
) -> None:
    work = Work(interrupt)
    with dg.raise_execution_interrupts(), pytest.raises(dg.DagsterExecutionInterruptedError):
        run_interruptibly(work.main())
    assert work.ended == {"main": "cancelled", "side": "cancelled"}


def test_sigterm_counts_as_an_interrupt_too() -> None:
    work = Work(lambda: _interrupt_self(signal.SIGTERM))
    with dg.raise_execution_interrupts(), pytest.raises(dg.DagsterExecutionInterruptedError):
        run_interruptibly(work.main())
    assert work.ended["main"] == "cancelled"


def test_without_an_interrupt_the_result_comes_back_and_the_handlers_are_restored() -> None:
    async def answer() -> int:
        await asyncio.sleep(0)
        return 42

    with dg.raise_execution_interrupts():
        dagster_handler = signal.getsignal(signal.SIGINT)
        assert run_interruptibly(answer()) == 42
        assert signal.getsignal(signal.SIGINT) is dagster_handler
        assert signal.getsignal(signal.SIGTERM) is dagster_handler
        # And Dagster's handler is in force again outside the loop.
        with pytest.raises(dg.DagsterExecutionInterruptedError):
            _interrupt_self()


def test_an_error_of_the_coroutine_is_raised_as_it_is() -> None:
    async def broken() -> None:
        raise ValueError("bad input")

    with pytest.raises(ValueError, match="bad input"):
        run_interruptibly(broken())


def test_a_runner_stays_interrupted_for_its_later_runs() -> None:
    """After a terminate, the cleanup a step still runs on the loop ends in the interrupt too."""

    async def closing() -> str:
        return "closed"

    with dg.raise_execution_interrupts(), interruptible_runner() as runner:
        with pytest.raises(dg.DagsterExecutionInterruptedError):
            runner.run(Work(in_a_callback).main())
        with pytest.raises(dg.DagsterExecutionInterruptedError):
            runner.run(closing())


def test_plain_asyncio_run_loses_the_interrupt_raised_in_a_callback() -> None:
    """Why the runner exists: the same interrupt under `asyncio.run` is logged and dropped, and
    the step would run on to its end (a terminated Batch API run ended `completed`)."""
    work = Work(in_a_callback, wait_s=0.2)
    with dg.raise_execution_interrupts():
        assert asyncio.run(work.main()) == "ran to the end"
    assert "main" not in work.ended
