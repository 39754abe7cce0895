"""The night bench's arithmetic: busy fraction and idle stretches from `/slots` samples."""

from __future__ import annotations

import pytest

from kimi_batch.bench.night import BusyTimeline


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
