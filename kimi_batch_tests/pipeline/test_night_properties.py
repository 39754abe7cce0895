"""Properties of the night's arithmetic in every IANA zone, across years and on the days the
clocks change: `pipeline/night.py` (`night_ds`, `window_end`), `pipeline/alerts.py`
(`due_night`, the morning's words for a night) and the tags `defs/schedules.py` puts on the
night's run.

What the docstrings promise, read literally:
- `night_ds`: the day that just ended at the scheduled time in the settings' zone (a naive time
  read as one of that zone): the local date before. It depends on the instant only, however the
  instant is written.
- `window_end`: the first KIMI_BATCH_NIGHT_ENDS after the scheduled time, in the zone: after it
  in real time, reading the end time on the moment's local date or the next, and no time the
  zone's clock reads the end time on those dates in between. On a fall-back day an end time in
  the repeated hour comes twice, so the first after a moment can be the second. On a
  spring-forward day an end time the clocks skip never comes: it is passed when they jump over
  it, and until then it is the window's end, read as Python reads a missing time (PEP 495: the
  offset before the change).
- `due_night`: the night after day D ends on D+1 at the end time (07:00 unset). The night due at
  a moment is the last whose end has come (its first occurrence, or the jump over a skipped one)
  and the next one's has not, so it never goes back as time goes on; the morning message names
  it and its end's local date and time.
- a tick of the nightly cron, at the times Dagster's own schedule iterator gives (on a change
  day the second of two times; for a skipped time the first after it, or the skipped time read
  with one offset or the other), names the night of the day before its local date; its window
  ends after it, its `dagster/max_runtime` is that window in real seconds plus the grace; a tick
  the clock can read ends within about a day, and on its own local date when the end time has
  not come yet (the night of D ends on D+1, and `due_night` names it from that end on). The real
  schedule, evaluated over the stand-ins, puts the same on its run.

Zones: all of `available_timezones()`, and twice as often one whose changes are not an hour,
not at 02:00, across midnight or a whole day, or backwards in summer. Instants: five times in
six at one of the zone's offset changes of 1970-2040 (found by bisection), within a day of it or
read off the clock in the span it repeats or skips, with the end and cron times often from that
span; otherwise anywhere in 1900-2100. Each window and night example also walks a dozen steps on
from its instant.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator, Mapping
from datetime import UTC, date, datetime, time, timedelta
from functools import cache
from itertools import islice
from pathlib import Path
from typing import Any, NamedTuple
from zoneinfo import ZoneInfo, available_timezones

import dagster as dg
import pytest
from dagster._check import CheckError
from dagster._utils.schedules import schedule_execution_time_iterator
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kimi_batch.defs import schedules
from kimi_batch.pipeline.alerts import (
    DEFAULT_NIGHT_ENDS,
    NightReport,
    PartitionRecord,
    PartitionState,
    due_night,
    night_message,
)
from kimi_batch.pipeline.night import WINDOW_GRACE_S, local_time, night_ds, window_end
from kimi_batch.settings import Settings
from kimi_batch_tests.support.inbox_files import put
from kimi_batch_tests.support.standins import standin_definitions

pytestmark = [pytest.mark.filterwarnings("ignore:Non-compliant tag keys:DeprecationWarning")]

EXAMPLES = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# The real schedule's evaluation lands an inbox file and reads a Dagster instance: a few only.
EVALUATIONS = settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])

ZONES = sorted(available_timezones())
# Changes of 30 min (Lord Howe) or 2 h (Troll), at midnight (Santiago, Havana, Asuncion, Beirut),
# odd offsets (St John's, Kathmandu, Chatham), a whole day skipped (Apia, Kiritimati, Kwajalein),
# summer time below winter time in the tz data (Dublin), Ramadan's pauses (Casablanca).
ODD_ZONES = [
    "Europe/Paris",
    "Europe/London",
    "Europe/Dublin",
    "America/New_York",
    "America/St_Johns",
    "America/Santiago",
    "America/Havana",
    "America/Asuncion",
    "America/Sao_Paulo",
    "Asia/Beirut",
    "Asia/Tehran",
    "Australia/Lord_Howe",
    "Asia/Kathmandu",
    "Pacific/Chatham",
    "Pacific/Apia",
    "Pacific/Kiritimati",
    "Pacific/Kwajalein",
    "Antarctica/Troll",
    "Africa/Casablanca",
]
HOUR = timedelta(hours=1)
QUARTER = HOUR / 4
DAY = timedelta(days=1)
# What KIMI_BATCH_NIGHT_ENDS can say: a time of day to the second (no `fold`: a variable has none).
ANY_TIME = st.times().map(lambda moment: moment.replace(microsecond=0, fold=0))


# ---- the zones' clock changes and what a wall-clock time is in them ---------------------------


@cache
def _changes(zone: str, year: int) -> tuple[datetime, ...]:
    """The instants (UTC) of `year` at which `zone`'s offset changes, to the second."""
    tz = ZoneInfo(zone)

    def offset(second: int) -> timedelta | None:
        return datetime.fromtimestamp(second, UTC).astimezone(tz).utcoffset()

    found = []
    step = 6 * 3600
    start = int(datetime(year, 1, 1, tzinfo=UTC).timestamp())
    end = int(datetime(year + 1, 1, 1, tzinfo=UTC).timestamp())
    for low in range(start, end, step):
        high = low + step
        if offset(low) == offset(high):
            continue
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if offset(middle) == offset(low) else (low, middle)
        found.append(datetime.fromtimestamp(high, UTC))
    return tuple(found)


def _utc(moment: datetime) -> datetime:
    """`moment` in UTC: two aware times of one zone compare and subtract as wall-clock times."""
    return moment.astimezone(UTC)


def _wall(moment: datetime) -> datetime:
    """What the clock reads at `moment` (naive; comparisons of naive times ignore `fold`)."""
    return moment.replace(tzinfo=None)


def _exists(moment: datetime) -> bool:
    """Whether the clock of `moment`'s zone ever reads its wall time (not one a change skips)."""
    return _wall(moment.astimezone(UTC).astimezone(moment.tzinfo)) == _wall(moment)


def _occurrences(zone: ZoneInfo, day: date, ends: time) -> list[datetime]:
    """The instants (UTC) at which `zone`'s clock reads `ends` on `day`: none where a change
    skips it, two where it repeats it."""
    nominal = datetime.combine(day, ends, zone)
    if not _exists(nominal):
        return []
    return sorted({_utc(nominal), nominal.replace(fold=1).astimezone(UTC)})


def _reached(zone: ZoneInfo, day: date, ends: time, now: datetime) -> bool:
    """Whether `zone`'s clock has come to `ends` on `day` by `now`: it read it once, or, where a
    change skips it, jumped over it."""
    occurrences = _occurrences(zone, day, ends)
    if occurrences:
        return occurrences[0] <= now
    return _wall(_utc(now).astimezone(zone)) >= datetime.combine(day, ends)


def _about_a_day(start: datetime, end: datetime) -> bool:
    """`end` within a day of `start` on the clock, in real time: a day, give or take the change
    of offset between them."""
    change = abs((end.utcoffset() or timedelta()) - (start.utcoffset() or timedelta()))
    return timedelta() < _utc(end) - _utc(start) <= DAY + change


# ---- settings and moments -----------------------------------------------------------------------


@cache
def _environment() -> dict[str, Any]:
    return Settings.from_env().model_dump()


def _settings(zone: str, ends: time | None, cron: str | None = None) -> Settings:
    """The environment's settings with the zone, window end and cron given, checked as the
    settings check them (what KIMI_BATCH_TIMEZONE/NIGHT_ENDS/NIGHTLY_CRON accept)."""
    values = {"timezone": zone, "night_ends": None if ends is None else ends.isoformat()}
    if cron is not None:
        values["nightly_cron"] = cron
    return Settings.model_validate(_environment() | values)


class Scene(NamedTuple):
    zone: str
    instant: datetime  # UTC
    ends: time  # a window end time
    starts: time  # a cron time


@st.composite
def _scenes(draw: st.DrawFn, first_year: int = 1900) -> Scene:
    """A zone, an instant and two wall-clock times: mostly at one of the zone's changes, the
    instant then often within the change's length of it and the times often from the wall-clock
    span the change repeats or skips (give or take a quarter of an hour)."""
    zone = draw(
        st.one_of(st.sampled_from(ZONES), st.sampled_from(ODD_ZONES), st.sampled_from(ODD_ZONES))
    )
    changes = _changes(zone, draw(st.integers(max(first_year, 1970), 2040)))
    if not changes or not draw(st.integers(0, 5)):
        uniform = st.datetimes(
            min_value=datetime(first_year, 1, 1),
            max_value=datetime(2100, 12, 31),
            timezones=st.just(UTC),
        )
        return Scene(zone, draw(uniform), draw(ANY_TIME), draw(ANY_TIME))
    change = draw(st.sampled_from(changes))
    tz = ZoneInfo(zone)
    before = _wall((change - timedelta(seconds=1)).astimezone(tz)) + timedelta(seconds=1)
    after = _wall(change.astimezone(tz))
    low = min(before, after) - QUARTER
    span = int((max(before, after) + QUARTER - low).total_seconds()) // 60
    walls = st.integers(0, span).map(lambda minutes: low + timedelta(minutes=minutes))
    # A moment read off the clock there: the first or the second pass of a repeated time.
    readings = st.tuples(walls, st.sampled_from([0, 1])).map(
        lambda reading: _utc(reading[0].replace(tzinfo=tz, fold=reading[1]))
    )
    around = st.one_of(st.integers(-span, span), st.integers(-26 * 60, 26 * 60)).map(
        lambda minutes: change + timedelta(minutes=minutes)
    )
    instant = draw(st.one_of(readings, around))
    instant += timedelta(seconds=draw(st.sampled_from([0, 0, 0, 1, 59])))
    times = st.one_of(walls.map(datetime.time), walls.map(datetime.time), ANY_TIME)
    return Scene(zone, instant, draw(times), draw(times))


def _writings(instant: datetime, zone: str) -> list[datetime]:
    """One instant written four ways: in UTC, in the zone, as the zone's naive wall time (its
    `fold` kept), in another zone."""
    local = instant.astimezone(ZoneInfo(zone))
    return [instant, local, _wall(local), instant.astimezone(ZoneInfo("Asia/Kathmandu"))]


def _ticks(zone: str, cron: str, start: datetime, count: int) -> list[datetime]:
    """The schedule's first `count` ticks from `start`, as Dagster computes them (fewer where its
    iterator gives up: it fails its own check on the day Kwajalein skipped, 1993-08-21)."""
    ticks: Iterator[datetime] = schedule_execution_time_iterator(start.timestamp(), cron, zone)
    found: list[datetime] = []
    with contextlib.suppress(CheckError):
        found.extend(islice(ticks, count))
    return found


# Daily at a drawn time (the ticks of five days around the instant), or every half hour (three
# hours of ticks around it: the first and the second pass of a repeated hour).
CRONS = st.one_of(
    st.none(),
    st.none(),
    st.just("*/30 * * * *"),
    st.just("0 2 * * *"),
)


def _cron_at(moment: time) -> str:
    return f"{moment.minute} {moment.hour} * * *"


# ---- nothing raises -----------------------------------------------------------------------------


@EXAMPLES
@given(
    _scenes(),
    st.datetimes(min_value=datetime(1900, 1, 2), max_value=datetime(2100, 12, 30)),
    st.booleans(),
    st.booleans(),
)
def test_nothing_raises_for_any_zone_moment_or_end_time(
    scene: Scene, naive: datetime, read_naive: bool, unset: bool
) -> None:
    """Any zone, any moment (a naive one any wall time, one a change skips or repeats among them),
    any end time or none: every function answers."""
    moment = naive if read_naive else scene.instant
    ends = None if unset else scene.ends
    config = _settings(scene.zone, ends)
    local = local_time(moment, config)
    assert local.tzinfo is config.zone
    assert date.fromisoformat(night_ds(moment, config)) < local.date()
    end = window_end(moment, config)
    assert (end is None) == (ends is None)
    ds, deadline = due_night(local, ends)
    schedules.nightly_tags(night_ds(moment, config), end, local)
    report = NightReport(
        ds=ds, deadline=deadline, fresh=False, freshness="late", expected=[], stale=[]
    )
    assert f"(night {ds})" in night_message(report, lambda _: None, "http://dagster")


# ---- the night a moment names -------------------------------------------------------------------


@EXAMPLES
@given(_scenes())
def test_the_night_is_the_local_day_before_however_the_moment_is_written(scene: Scene) -> None:
    config = _settings(scene.zone, None)
    expected = (scene.instant.astimezone(config.zone).date() - DAY).isoformat()
    writings = _writings(scene.instant, scene.zone)
    assert {night_ds(written, config) for written in writings} == {expected}


# ---- the window's end ---------------------------------------------------------------------------

# The moments an example looks at: the drawn one and a dozen after it, a step apart (a step of a
# few minutes walks through a repeated or skipped hour).
SWEEPS = st.tuples(st.sampled_from([1, 7, 10, 15, 60, 360]), st.integers(0, 12)).map(
    lambda sweep: [timedelta(minutes=sweep[0] * step) for step in range(sweep[1] + 1)]
)


def _check_window_end(instant: datetime, zone: str, config: Settings) -> None:
    tz, ends = config.zone, config.night_ends
    assert ends is not None
    local = instant.astimezone(tz)
    found = [window_end(written, config) for written in _writings(instant, zone)]
    ends_at = {_utc(end) for end in found if end is not None}
    assert len(ends_at) == 1, f"one instant written four ways, ends {found}"
    end = found[1]
    assert end is not None

    assert end.tzinfo is tz
    assert _wall(end).time() == ends
    assert end.date() in (local.date(), local.date() + DAY)
    assert _utc(end) > instant, f"the window of {local} ends before it, at {end}"
    assert _about_a_day(local, end)
    # The first: the clock reads the end time nowhere between the moment and the window's end
    # on those two dates (St John's fell back from 00:01 to 23:01 the day before until 2011: that
    # minute's second 23:01 is not looked for).
    between = [
        occurrence
        for day in (local.date(), local.date() + DAY)
        for occurrence in _occurrences(tz, day, ends)
        if instant < occurrence < _utc(end)
    ]
    assert not between, f"from {local} the clock reads {ends} at {between[0].astimezone(tz)} first"
    if _exists(end):
        assert _utc(end) in _occurrences(tz, end.date(), ends)
    else:  # a time the clocks skip that day: the end only until they jump over it
        assert not _reached(tz, end.date(), ends, instant)


@EXAMPLES
@given(_scenes(), SWEEPS)
def test_the_window_ends_at_the_first_end_time_after_the_moment(
    scene: Scene, sweep: list[timedelta]
) -> None:
    config = _settings(scene.zone, scene.ends)
    for offset in sweep:
        _check_window_end(scene.instant + offset, scene.zone, config)


# ---- the night due in the morning ---------------------------------------------------------------


def _check_due_night(now: datetime, night_ends: time) -> str:
    """The night due at `now` (in its zone), checked; unset, the end time is 07:00."""
    tz = now.tzinfo
    assert isinstance(tz, ZoneInfo)
    ds, deadline = due_night(now, night_ends)
    assert due_night(now, None) == due_night(now, DEFAULT_NIGHT_ENDS)

    night = date.fromisoformat(ds)
    assert deadline.tzinfo is tz
    assert _wall(deadline) == datetime.combine(night + DAY, night_ends)
    assert _reached(tz, night + DAY, night_ends, now), f"at {now} night {ds} is not over yet"
    assert not _reached(tz, night + 2 * DAY, night_ends, now), (
        f"at {now} the night after {ds} is over too"
    )
    if _exists(deadline):  # the first time the clock read it, as `window_end` gives it
        assert _utc(deadline) == _occurrences(tz, night + DAY, night_ends)[0]

    report = NightReport(
        ds=ds,
        deadline=deadline,
        fresh=True,
        freshness="",
        expected=["k"],
        stale=[PartitionRecord(key="k", state=PartitionState.PENDING)],
    )
    headline = night_message(report, lambda _: None, "http://dagster").splitlines()[0]
    assert f"night {ds} not distilled by {night + DAY} {night_ends:%H:%M}" in headline
    return ds


@EXAMPLES
@given(_scenes(), SWEEPS)
def test_the_night_due_is_the_last_whose_end_has_come_and_never_goes_back(
    scene: Scene, sweep: list[timedelta]
) -> None:
    tz = ZoneInfo(scene.zone)
    due = [
        _check_due_night((scene.instant + offset).astimezone(tz), scene.ends) for offset in sweep
    ]
    assert due == sorted(due), f"{scene.instant} and {len(sweep) - 1} steps on: nights {due}"


# ---- the scheduled tick -------------------------------------------------------------------------


def _check_tick(tick: datetime, config: Settings, tags: Mapping[str, str]) -> None:
    """A tick's run tags: its night, a window ending after it at the end time, a matching
    max_runtime; within about a day on the right date, and from the window's end on
    `due_night` names its night."""
    tz, ends = config.zone, config.night_ends
    assert ends is not None
    local = tick.astimezone(tz)  # as Dagster wrote it: the night is named from its date
    night = local.date() - DAY
    assert tags[schedules.NIGHT_TAG] == night.isoformat()
    # As written: the end time on the zone's clock (a skipped one with the offset before).
    written = datetime.fromisoformat(tags[schedules.WINDOW_TAG])
    assert written.time() == ends
    if _occurrences(tz, written.date(), ends):  # a real reading of the zone's clock
        assert written.utcoffset() == written.astimezone(tz).utcoffset()
    end = written.astimezone(tz)
    assert _utc(end) > _utc(tick), f"the window of the tick at {local} ends before it, at {end}"
    window_s = int(tags[schedules.MAX_RUNTIME_TAG]) - WINDOW_GRACE_S
    assert window_s == int((_utc(end) - _utc(tick)).total_seconds())
    # Dagster can put a tick at a time the clocks skip, even a day ahead of its instant (a fold=1
    # reading on the day Kanton or Apia skipped): nothing promises more for it than the above.
    if not _exists(tick):
        return
    assert _about_a_day(local, end)
    if _reached(tz, local.date(), ends, tick):
        return
    # A night that starts before its end time: the night of D ends on D+1, and is due from then.
    assert (written.date(), written.time()) == (local.date(), ends)
    assert due_night(local, ends)[0] == (night - DAY).isoformat()
    ds, deadline = due_night(end, ends)
    assert (ds, _utc(deadline)) == (night.isoformat(), _utc(end))
    if _occurrences(tz, local.date(), ends):  # not a time the clocks skip that day
        just_before = (_utc(end) - timedelta(seconds=1)).astimezone(tz)
        assert due_night(just_before, ends)[0] == (night - DAY).isoformat()


@EXAMPLES
@given(_scenes(), CRONS)
def test_a_tick_s_window_ends_after_it_on_its_night_s_morning(
    scene: Scene, cron: str | None
) -> None:
    """The night starts at a time around the change (or on a usual cron) and its window ends at
    one: ticks fall in the repeated hour, just after a skipped one, before and after the end."""
    config = _settings(scene.zone, scene.ends, cron or _cron_at(scene.starts))
    if config.nightly_cron.startswith("*/30"):
        ticks = _ticks(scene.zone, config.nightly_cron, scene.instant - 1.5 * HOUR, 6)
    else:
        ticks = _ticks(scene.zone, config.nightly_cron, scene.instant - 2 * DAY, 5)
    for tick in ticks:
        end = window_end(tick, config)
        tags = schedules.nightly_tags(night_ds(tick, config), end, local_time(tick, config))
        _check_tick(tick, config, tags)


def test_the_real_schedule_s_run_carries_its_night_and_window() -> None:
    """The schedule itself, evaluated at its own ticks over the stand-ins (one inbox file, dated
    before every tick, so that every tick asks for a run)."""
    with tempfile.TemporaryDirectory() as name, dg.instance_for_test() as instance:
        home = Path(name)
        put(home / "inbox" / "2025-01-01" / "alpha.jsonl")

        @EVALUATIONS
        @given(_scenes(first_year=2025))
        def evaluated(scene: Scene) -> None:
            config = _settings(scene.zone, scene.ends, _cron_at(scene.starts))
            defs = standin_definitions(config.model_copy(update={"home": home}))
            start = max(scene.instant - DAY, datetime(2025, 1, 3, tzinfo=UTC))
            for tick in _ticks(scene.zone, config.nightly_cron, start, 1):
                with dg.build_schedule_context(
                    instance=instance,
                    scheduled_execution_time=tick,
                    repository_def=defs.get_repository_def(),
                ) as context:
                    schedule = defs.resolve_schedule_def("nightly_distillation_schedule")
                    data = schedule.evaluate_tick(context)
                (request,) = data.run_requests or []
                _check_tick(tick, config, request.tags)

        evaluated()


# ---- the fall-back hour, pinned -----------------------------------------------------------------

NEW_YORK = ZoneInfo("America/New_York")
# 2025-11-02 in New York: 01:00-02:00 comes twice, EDT (-04, 05:00-06:00 UTC) then EST (-05).
FIRST_0145 = datetime(2025, 11, 2, 5, 45, tzinfo=UTC)
SECOND_0145 = datetime(2025, 11, 2, 6, 45, tzinfo=UTC)


@pytest.mark.parametrize(
    ("tick", "first_after"),
    [
        # Dagster's daily "30 1 * * *" tick that day: the second 01:30 (EST).
        (datetime(2025, 11, 2, 6, 30, tzinfo=UTC), SECOND_0145),
        # 01:50 EDT, an hourly cron's: the clock reads 01:45 again 55 minutes later.
        (datetime(2025, 11, 2, 5, 50, tzinfo=UTC), SECOND_0145),
        (datetime(2025, 11, 2, 5, 30, tzinfo=UTC), FIRST_0145),
    ],
)
def test_a_window_ending_in_the_repeated_hour_ends_after_its_tick(
    tick: datetime, first_after: datetime
) -> None:
    config = _settings("America/New_York", time(1, 45))
    end = window_end(tick.astimezone(NEW_YORK), config)
    assert end is not None
    assert (_utc(end), _wall(end).time()) == (first_after, time(1, 45))


def test_the_night_due_does_not_go_back_when_the_clocks_do() -> None:
    """Night 2025-11-01 ends at the first 01:45 (EDT); at 01:30 EST, later, it is still the one
    due, not the night before."""
    for now in (
        FIRST_0145,
        datetime(2025, 11, 2, 5, 50, tzinfo=UTC),
        datetime(2025, 11, 2, 6, 30, tzinfo=UTC),
    ):
        ds, deadline = due_night(now.astimezone(NEW_YORK), time(1, 45))
        assert (ds, _utc(deadline)) == ("2025-11-01", FIRST_0145)
