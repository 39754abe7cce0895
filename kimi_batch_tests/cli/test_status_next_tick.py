"""`kimi-batch status` names the nightly schedule's next tick as the daemon will run it."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from kimi_batch.cli.status import _next_tick


@pytest.mark.parametrize(
    ("cron", "zone", "now", "expected"),
    [
        ("0 2 * * *", "UTC", datetime(2026, 12, 1, 9, 30, tzinfo=UTC), "2026-12-02T02:00:00+00:00"),
        # Exactly on a tick: the next one, not this one.
        ("0 2 * * *", "UTC", datetime(2026, 12, 1, 2, 0, tzinfo=UTC), "2026-12-02T02:00:00+00:00"),
        (
            "0 2 * * *",
            "Asia/Tokyo",
            datetime(2026, 12, 1, 9, 30, tzinfo=UTC),
            "2026-12-02T02:00:00+09:00",
        ),
        # 02:30 does not exist in Berlin on the spring-forward night: Dagster runs it at 03:00.
        (
            "30 2 * * *",
            "Europe/Berlin",
            datetime(2026, 3, 29, 0, 59, tzinfo=UTC),
            "2026-03-29T03:00:00+02:00",
        ),
        ("0 2 1 * *", "UTC", datetime(2026, 12, 1, 9, 30, tzinfo=UTC), "2027-01-01T02:00:00+00:00"),
    ],
)
def test_next_tick_is_the_first_after_now(
    cron: str, zone: str, now: datetime, expected: str
) -> None:
    assert _next_tick(cron, zone, now).isoformat() == expected
