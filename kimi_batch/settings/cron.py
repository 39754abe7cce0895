"""Cron expressions checked when the settings are read, not when the code location loads.

Dagster decides which expressions its schedules take (its own copy of croniter, with rules of its
own, such as no February 30th), so Dagster is asked: a grammar of our own accepted expressions
Dagster refused (`0 2 * * 1,`, `*/0 * * * *`, `0 2 * * 5#6`), and the code location then failed to
load. croniter itself is no substitute: its current release takes more than Dagster's copy does
(`15W`, the weekday nearest the 15th).
"""

from __future__ import annotations

import warnings

from kimi_batch.settings.defaults import DEFAULT_MAINTENANCE_CRON, DEFAULT_NIGHTLY_CRON

# Taken without asking (the deployment's schedules are built from them in every test run): a
# command that reads the settings does not import Dagster for them (~0.6 s).
_SHIPPED = frozenset((DEFAULT_NIGHTLY_CRON, DEFAULT_MAINTENANCE_CRON))


def is_cron(expression: str) -> bool:
    """Whether Dagster's schedules take `expression` (a 5-field cron expression or an
    `@daily`-style alias), checked by the constructor the code location runs."""
    if expression in _SHIPPED:
        return True
    # Imported here: the settings are the ground every layer stands on, the Dagster-free features
    # included; only a cron expression of the user's own needs Dagster.
    import dagster as dg

    try:
        # Quietly: Dagster warns about some expressions (a step past the field's range) as it
        # builds a schedule, which would print before every command that reads the settings.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dg.ScheduleDefinition(
                name="cron_check", cron_schedule=expression, job_name="cron_check"
            )
    except dg.DagsterInvalidDefinitionError:
        return False
    return True
