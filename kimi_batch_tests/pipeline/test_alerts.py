"""What the morning is told: the night due at a moment, a webhook that refuses a message (a
real HTTP receiver on loopback)."""

from datetime import UTC, datetime, time

import pytest

from kimi_batch.pipeline.alerts import due_night
from kimi_batch.pipeline.webhook import post_message
from kimi_batch_tests.support.webhook import Receiver


@pytest.mark.parametrize(
    ("now", "expected_ds", "expected_deadline"),
    [
        (datetime(2026, 3, 10, 6, 59, tzinfo=UTC), "2026-03-08", datetime(2026, 3, 9, 7, 0)),
        (datetime(2026, 3, 10, 7, 0, tzinfo=UTC), "2026-03-09", datetime(2026, 3, 10, 7, 0)),
        (datetime(2026, 3, 10, 23, 0, tzinfo=UTC), "2026-03-09", datetime(2026, 3, 10, 7, 0)),
    ],
)
def test_due_night_is_the_last_night_whose_window_ended(
    now: datetime, expected_ds: str, expected_deadline: datetime
) -> None:
    ds, deadline = due_night(now, time(7, 0))
    assert ds == expected_ds
    assert deadline == expected_deadline.replace(tzinfo=UTC)


def test_a_webhook_that_fails_is_reported_not_raised() -> None:
    with Receiver(status=500) as broken:
        result = post_message(broken.url, "hello")
    assert not result.delivered
    assert result.status_code == 500
    assert broken.texts == ["hello"]
