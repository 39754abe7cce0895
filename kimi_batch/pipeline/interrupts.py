"""Event loops that a terminated run stops for certain, no Dagster.

Dagster terminates a run by sending SIGINT to the step process, whose handler raises
`DagsterExecutionInterruptedError` at whatever bytecode the main thread is on. Inside an asyncio
event loop that is unsafe: an exception other than KeyboardInterrupt/SystemExit raised in a loop
callback (a socket's read, a timer) is logged as "Exception in callback" and dropped, and one
raised in the step of a task nobody awaits yet is parked on that task. The interrupt is then
lost and the step runs on to the end, as if nobody had asked it to stop.

`InterruptibleRunner` takes the signal over while its loop runs: the handler only records it and
cancels the running coroutine (as `asyncio.Runner` does for Ctrl-C), every task of the loop is
cancelled (their connections close, so llama-server stops those slots), and only then, outside
the loop, the interrupt the caller names (`interrupt`: Dagster's, in `defs/assets/driver.py`) is
raised for the orchestrator and the asset's own cleanup.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from contextvars import Context
from types import FrameType
from typing import Any, TypeVar

T = TypeVar("T")

# Dagster's interrupt handlers map SIGTERM onto the SIGINT handler (run workers on Kubernetes).
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


# What an interrupted run raises once its loop has stopped.
Interrupt = Callable[[], BaseException]


class InterruptibleRunner:
    """Runs coroutines on an `asyncio.Runner`'s loop; `run` turns SIGINT/SIGTERM into a
    cancelled coroutine, then raises `interrupt()` once every task of the loop has stopped.
    Once interrupted it stays so: the cleanup a step still runs on it ends in the interrupt
    too."""

    def __init__(self, runner: asyncio.Runner, interrupt: Interrupt) -> None:
        self._runner = runner
        self._interrupt = interrupt
        self.interrupted = False

    def run(self, coro: Coroutine[Any, Any, T], *, context: Context | None = None) -> T:
        if threading.current_thread() is not threading.main_thread():
            return self._runner.run(coro, context=context)  # signals reach the main thread only
        loop = self._runner.get_loop()
        task = loop.create_task(coro, context=context)

        def on_signal(_signo: int, _frame: FrameType | None) -> None:
            # Runs between two bytecodes of the main thread, maybe inside the loop: only record
            # and schedule (what asyncio.Runner's own SIGINT handler does).
            self.interrupted = True
            loop.call_soon_threadsafe(task.cancel)

        previous = {sig: signal.signal(sig, on_signal) for sig in _SIGNALS}
        try:
            self._until_stopped(loop, task)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if self.interrupted:
            raise self._interrupt()
        return task.result()

    def _until_stopped(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> None:
        try:
            loop.run_until_complete(task)
        except (asyncio.CancelledError, Exception):
            if not self.interrupted:
                raise
            # Interrupted: what the coroutine raised on its way out is not why it stopped.
        if self.interrupted:
            # Whatever the coroutine left running (a task it did not await) stops too.
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for left in pending:
                left.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))


@contextmanager
def interruptible_runner(interrupt: Interrupt) -> Iterator[InterruptibleRunner]:
    """`asyncio.Runner()` for a step (see the module); closed on exit."""
    with asyncio.Runner() as runner:
        yield InterruptibleRunner(runner, interrupt)


def run_interruptibly(main: Coroutine[Any, Any, T], interrupt: Interrupt) -> T:
    """`asyncio.run` for a step: a terminated run cancels `main` (see the module)."""
    with interruptible_runner(interrupt) as runner:
        return runner.run(main)
