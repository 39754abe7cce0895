"""Cron expressions checked when the settings are read, not when the code location loads."""

from __future__ import annotations

import re

# Minute, hour, day of month, month, day of week. Numbers must lie in range; words must be month
# or day names (or `l`, croniter's "last"); `*`, `?`, ranges, steps, lists and `#` pass.
_CRON_RANGES = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))
_CRON_WORDS = frozenset(
    [
        "jan",
        "feb",
        "mar",
        "apr",
        "may",
        "jun",
        "jul",
        "aug",
        "sep",
        "oct",
        "nov",
        "dec",
        "sun",
        "mon",
        "tue",
        "wed",
        "thu",
        "fri",
        "sat",
        "l",
    ]
)
_CRON_ALIASES = frozenset(
    ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
)


def is_cron(expression: str) -> bool:
    """A 5-field cron expression or an `@daily`-style alias (what Dagster's schedules take),
    checked here so a bad one is a configuration error rather than a definition error when the
    code location loads."""
    fields = expression.lower().split()
    if len(fields) == 1 and fields[0] in _CRON_ALIASES:
        return True
    if len(fields) != 5:
        return False
    for field, (low, high) in zip(fields, _CRON_RANGES, strict=True):
        if not re.fullmatch(r"[0-9a-z*?,/#-]+", field):
            return False
        # Steps (`*/15`) and nth weekdays (`fri#2`) are counts, not values of the field.
        for token in re.findall(r"[0-9a-z]+", re.sub(r"[/#][0-9]+", "", field)):
            if token.isdigit():
                if not low <= int(token) <= high:
                    return False
            elif token not in _CRON_WORDS:
                return False
    return True
