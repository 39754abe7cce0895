"""Terminal progress bars for batches (rich): one line per batch with rows, tok/s and ETA.

Reusable by any command that runs batches in this process: use it as the engine's `on_progress`
callback, or under `kimi_batch.engine.progress.listening` for batches run by Dagster assets
in-process (`kimi-batch demo`). Only for terminals: `wants_bar()` says whether stderr is one;
otherwise callers keep printing plain log lines.
"""

from __future__ import annotations

from types import TracebackType
from typing import Self

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from kimi_batch.engine import ProgressEvent


def wants_bar(console: Console | None = None) -> bool:
    """True when stderr is an interactive terminal (not a pipe, a file or a dumb terminal)."""
    console = console or Console(stderr=True)
    return console.is_terminal and not console.is_dumb_terminal


def _eta(event: ProgressEvent) -> str:
    if event.done >= event.total:
        return "done"
    if event.eta_s is None:
        return "?"
    minutes, seconds = divmod(int(event.eta_s), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}"


class BatchProgressBar:
    """One bar per batch label; call it with `ProgressEvent`s."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("rows"),
            TextColumn("{task.fields[tok_s]:>6.1f} tok/s"),
            TextColumn("ETA {task.fields[eta]}"),
            TimeElapsedColumn(),
            console=self.console,
        )
        self._tasks: dict[str, TaskID] = {}

    def __enter__(self) -> Self:
        self.progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.progress.stop()

    def start(self, label: str, total: int) -> None:
        """Show a bar before its first event (a batch that is warming up)."""
        if label not in self._tasks:
            self._tasks[label] = self.progress.add_task(label, total=total, tok_s=0.0, eta="?")

    def __call__(self, event: ProgressEvent) -> None:
        label = event.label or "batch"
        self.start(label, event.total)
        self.progress.update(
            self._tasks[label],
            completed=event.done,
            total=event.total,
            tok_s=event.completion_tokens_per_s,
            eta=_eta(event),
        )
