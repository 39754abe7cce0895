"""The night's arithmetic: the day that just ended, the window's end, the partitions asked for."""

from __future__ import annotations

from datetime import UTC, datetime, time
from zoneinfo import ZoneInfo

import pytest

from kimi_batch.inputs.landing import Assignment
from kimi_batch.pipeline.night import BatchPartition, night_ds, nightly_partitions, window_end
from kimi_batch.settings import Settings

NIGHT = datetime(2025, 6, 2, 2, 0, tzinfo=UTC)  # the night after June 1


def settings_in(zone: str) -> Settings:
    return Settings.from_env().model_copy(update={"timezone": zone})


def test_window_end_is_the_next_end_time_in_the_schedules_zone() -> None:
    tokyo = settings_in("Asia/Tokyo").model_copy(update={"night_ends": time(7, 0)})
    end = window_end(datetime(2025, 6, 1, 17, 0, tzinfo=UTC), tokyo)  # 02:00 in Tokyo
    assert end == datetime(2025, 6, 2, 7, 0, tzinfo=ZoneInfo("Asia/Tokyo"))
    late = window_end(datetime(2025, 6, 1, 23, 0, tzinfo=UTC), tokyo)  # 08:00 in Tokyo
    assert late == datetime(2025, 6, 3, 7, 0, tzinfo=ZoneInfo("Asia/Tokyo"))
    assert window_end(NIGHT, settings_in("UTC")) is None


def test_nightly_partitions_pure() -> None:
    assignments = [
        Assignment(name=n, ds=d, source=src, first_seen=0.0, dated_ds=None, refused=None)
        for n, d, src in [
            ("a", "2025-06-01", "a"),
            ("b", "2025-06-02", "b"),
            ("c", "2025-06-03", "c"),
            ("d", "2025-05-01", "d"),
        ]
    ]
    assert nightly_partitions(assignments, ["2025-06-01|a"], "2025-06-02") == [
        BatchPartition(ds="2025-05-01", source="d"),
        BatchPartition(ds="2025-06-02", source="b"),
    ]
    assert nightly_partitions([], [], "2030-01-01") == []


def test_a_partition_built_from_an_older_input_is_asked_for_again_oldest_first() -> None:
    assignments = [
        Assignment(name=n, ds=d, source=n, first_seen=0.0, dated_ds=None, refused=None)
        for n, d in [("new", "2025-06-02"), ("rewritten", "2025-06-01"), ("same", "2025-05-31")]
    ]
    distilled = ["2025-06-01|rewritten", "2025-05-31|same"]

    wanted = nightly_partitions(assignments, distilled, "2025-06-02", ["2025-06-01|rewritten"])

    assert wanted == [
        BatchPartition(ds="2025-06-01", source="rewritten"),
        BatchPartition(ds="2025-06-02", source="new"),
    ]


@pytest.mark.parametrize(
    ("when", "zone", "ds"),
    [
        (datetime(2025, 6, 2, 2, 0, tzinfo=UTC), "UTC", "2025-06-01"),
        (datetime(2025, 6, 2, 2, 0), "Europe/Berlin", "2025-06-01"),  # naive = schedule time
        # 00:30 UTC on June 2 is still June 1 in New York: the night of May 31 just ended there.
        (datetime(2025, 6, 2, 0, 30, tzinfo=UTC), "America/New_York", "2025-05-31"),
        (datetime(2025, 1, 1, 2, 0, tzinfo=ZoneInfo("Asia/Tokyo")), "Asia/Tokyo", "2024-12-31"),
    ],
)
def test_night_ds(when: datetime, zone: str, ds: str) -> None:
    assert night_ds(when, settings_in(zone)) == ds
