"""The settings take a cron expression exactly when the deployment's schedules do: a value the
settings accept never fails the code location's load, and none that Dagster would run is refused."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from kimi_batch.defs.maintenance import build_maintenance_schedule
from kimi_batch.defs.schedules import build_nightly_schedule
from kimi_batch.settings import Settings

pytestmark = pytest.mark.no_llama_server

# The pieces of cron fields, valid and not, in and out of each field's range: numbers, names,
# croniter's `l`, `w` and `#`, ranges, steps and lists, and stray separators.
_ATOMS = [
    "0", "1", "2", "5", "7", "8", "12", "15", "23", "24", "29", "30", "31", "59", "60",
    "*", "?", "l", "L", "w", "15w", "5l", "1L", "mon", "fri", "sun", "jan", "feb", "dec",
    "1-5", "5-1", "mon-fri", "fri-mon", "jan-mar", "*/15", "*/0", "1/2", "?/2", "1-31/2",
    "1,2", "1,l", "5#2", "5#6", "fri#2", "#", "-", ",", "1-", "1#", "",
]  # fmt: skip
_ALIASES = ["@daily", "@midnight", "@hourly", "@weekly", "@monthly", "@yearly", "@reboot"]

_crons = st.one_of(
    st.lists(st.sampled_from(_ATOMS), min_size=4, max_size=6).map(" ".join),
    st.sampled_from(_ALIASES),
)


_BASE = Settings.from_env()


def _settings_take(cron: str) -> Settings | None:
    try:
        return Settings.model_validate(
            {**_BASE.model_dump(), "nightly_cron": cron, "maintenance_cron": cron}
        )
    except ValidationError:
        return None


def _dagster_takes(cron: str) -> bool:
    # The settings without the check (`model_copy` validates nothing): what Dagster does with it.
    unchecked = _BASE.model_copy(update={"nightly_cron": cron, "maintenance_cron": cron})
    try:
        build_nightly_schedule(unchecked)
        build_maintenance_schedule(unchecked)
    except Exception:
        return False
    return True


@settings(max_examples=300, deadline=None)
@given(cron=_crons)
def test_the_settings_take_a_cron_exactly_when_the_schedules_do(cron: str) -> None:
    taken = _settings_take(cron)
    assert (taken is not None) == _dagster_takes(cron), cron
    if taken is not None:  # and the schedules built from the checked settings load
        assert build_nightly_schedule(taken).cron_schedule == cron
        assert build_maintenance_schedule(taken).cron_schedule == cron
