"""Was the server busy: busy fraction and idle stretches by cause, from `/slots` samples."""

from __future__ import annotations

import pytest

from kimi_batch_bench.busy import BusyTimeline, Window, idle_by_cause


def test_busy_fraction_counts_from_the_first_busy_sample_to_the_last() -> None:
    # idle before the first request and after the last one is not the night's
    flags = [False, False, True, True, False, True, True, True, False, False]
    timeline = BusyTimeline([(float(t), busy) for t, busy in enumerate(flags)])

    assert timeline.span == (2.0, 7.0)
    assert timeline.busy_fraction() == pytest.approx(5 / 6)
    assert list(timeline.idle_gaps()) == [(4.0, 5.0)]


def test_a_night_without_requests_has_no_span() -> None:
    timeline = BusyTimeline([(0.0, False), (1.0, False)])

    assert timeline.span is None
    assert timeline.busy_fraction() == 0.0
    assert list(timeline.idle_gaps()) == []


def test_idle_stretches_are_blamed_on_the_run_start_the_step_start_or_the_write() -> None:
    # One sample a second. Run A: amplify 2-5 (busy 2-3), distill 7-10 (busy 8-9), write 9-10;
    # run B starts at 13, its amplify at 15 (busy 15-16).
    busy = {2, 3, 8, 9, 15, 16}
    timeline = BusyTimeline([(float(t), t in busy) for t in range(18)])
    windows = [
        Window("a", "run", 0.0, 11.0),
        Window("a", "amplified_prompts", 2.0, 5.0),
        Window("a", "distilled_responses", 7.0, 10.5),
        Window("b", "run", 13.0, 17.0),
        Window("b", "amplified_prompts", 14.0, 17.0),
    ]

    idle = idle_by_cause(timeline, windows)

    # 4-8: amplify's write (4-5) and the distill step's start (5-8), blamed by the middle (6):
    # between two steps of run A, the next step's start.
    assert idle["step_start"] == 4.0
    # 10-15: distill's end, run B's launch and its seeds: run start (middle 12.5, between runs).
    assert idle["run_start"] == 5.0
    assert idle["write"] == 0.0
    assert sum(idle.values()) == pytest.approx((1 - timeline.busy_fraction()) * 15)
