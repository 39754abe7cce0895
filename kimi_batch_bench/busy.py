"""Was the server busy: "any slot processing" sampled from `/slots`, and each idle stretch
blamed on where the runs were (their event logs).

Busy = at least one slot processing. Idle stretches between the first busy sample and the last
are attributed by where their middle falls among the runs' and steps' spans: before a run's first
generating step ("run_start": queue, launcher, process start, `seed_prompts`), inside a step
before its first request ("step_start": process start, digest restore), after a step's last
request ("write": Parquet, checks, Trino), inside a step between two busy stretches ("other": in
`nightly_job` the amplified partitions written and the distillation planned between its two
batches). The night bench and the rehearsal use it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

__all__ = [
    "POLL_S",
    "BusyTimeline",
    "SlotPoller",
    "Window",
    "generating_steps",
    "idle_by_cause",
    "run_windows",
]

POLL_S = 0.05


@dataclass(frozen=True)
class BusyTimeline:
    """Samples of "any slot processing" over time (monotonic seconds)."""

    samples: list[tuple[float, bool]]

    @property
    def span(self) -> tuple[float, float] | None:
        busy = [t for t, processing in self.samples if processing]
        return (busy[0], busy[-1]) if busy else None

    def busy_fraction(self) -> float:
        span = self.span
        if span is None:
            return 0.0
        inside = [p for t, p in self.samples if span[0] <= t <= span[1]]
        return sum(inside) / len(inside) if inside else 0.0

    def idle_gaps(self) -> Iterator[tuple[float, float]]:
        """(start, end) of each idle stretch between the first busy sample and the last."""
        span = self.span
        if span is None:
            return
        start: float | None = None
        for t, processing in self.samples:
            if t < span[0] or t > span[1]:
                continue
            if not processing and start is None:
                start = t
            elif processing and start is not None:
                yield start, t
                start = None


class SlotPoller:
    """Polls `/slots` in a thread until stopped; `timeline` holds what it saw."""

    def __init__(self, base_url: str, interval_s: float = POLL_S) -> None:
        self.base_url = base_url
        self.interval_s = interval_s
        self.samples: list[tuple[float, bool]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="slot-poller", daemon=True)

    def __enter__(self) -> SlotPoller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    @property
    def timeline(self) -> BusyTimeline:
        return BusyTimeline(list(self.samples))

    def _poll(self) -> None:
        with httpx.Client(base_url=self.base_url, timeout=5.0) as client:
            while not self._stop.is_set():
                try:
                    slots = client.get("/slots").json()
                    busy = any(bool(slot.get("is_processing")) for slot in slots)
                    self.samples.append((time.monotonic(), busy))
                except (httpx.HTTPError, ValueError):
                    pass
                self._stop.wait(self.interval_s)


@dataclass(frozen=True)
class Window:
    run_id: str
    kind: str  # "run" or a step key
    start: float
    end: float


def run_windows(instance: Any, run_ids: Sequence[str], offset: float) -> list[Window]:
    """Run and step spans from the event logs, on the poller's monotonic clock."""
    import dagster as dg

    windows: list[Window] = []
    for run_id in run_ids:
        records = instance.all_logs(run_id)
        # From RUN_START (the run's process is up) on: a run is in the log from when it was
        # queued, and the night queues all its runs at once.
        started = [
            r.timestamp - offset
            for r in records
            if r.dagster_event is not None
            and r.dagster_event.event_type == dg.DagsterEventType.RUN_START
        ]
        if not started:
            continue
        windows.append(
            Window(run_id, "run", min(started), max(r.timestamp for r in records) - offset)
        )
        starts: dict[str, float] = {}
        for record in records:
            event = record.dagster_event
            if event is None or event.step_key is None:
                continue
            if event.event_type == dg.DagsterEventType.STEP_START:
                starts[event.step_key] = float(record.timestamp) - offset
            elif event.event_type in (
                dg.DagsterEventType.STEP_SUCCESS,
                dg.DagsterEventType.STEP_FAILURE,
            ):
                ended = float(record.timestamp) - offset
                begun = starts.get(event.step_key, ended)
                windows.append(Window(run_id, event.step_key, begun, ended))
    return windows


def generating_steps() -> set[str]:
    """The steps that send requests: each declared nightly stage's, and the nightly job's one."""
    from kimi_batch.defs.jobs import NIGHTLY_OP_NAME
    from kimi_batch_bench.stages import night_stage_assets

    return {*night_stage_assets(), NIGHTLY_OP_NAME}


def _cause(gap: tuple[float, float], windows: Sequence[Window], timeline: BusyTimeline) -> str:
    """Why the server idled: where the gap's middle falls among the runs' and steps' spans."""
    generating = generating_steps()
    middle = (gap[0] + gap[1]) / 2
    for window in windows:
        if window.kind in generating and window.start <= middle <= window.end:
            busy_before = any(p for t, p in timeline.samples if window.start <= t < gap[0])
            busy_after = any(p for t, p in timeline.samples if gap[1] <= t <= window.end)
            if not busy_before:
                return "step_start"
            return "other" if busy_after else "write"
    run = next((w for w in windows if w.kind == "run" and w.start <= middle <= w.end), None)
    if run is None:
        return "run_start"  # between runs: the queue, the launcher, the run's process
    first_generating = min(
        (w.start for w in windows if w.run_id == run.run_id and w.kind in generating),
        default=run.end,
    )
    # Inside a run before its first generating step: its process, `seed_prompts`. After it:
    # between two steps, the next step's start (its process, with the multiprocess executor).
    return "run_start" if middle < first_generating else "step_start"


def idle_by_cause(timeline: BusyTimeline, windows: Sequence[Window]) -> dict[str, float]:
    """Seconds of idle server between the first request and the last, by cause."""
    idle: dict[str, float] = {"run_start": 0.0, "step_start": 0.0, "write": 0.0, "other": 0.0}
    for gap in timeline.idle_gaps():
        idle[_cause(gap, windows, timeline)] += gap[1] - gap[0]
    return idle
