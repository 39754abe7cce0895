"""The nightly window: its end (a run tag), and a step it cut short."""

from __future__ import annotations

from datetime import UTC, datetime

import dagster as dg

from kimi_batch.defs.assets.context import RunContext
from kimi_batch.defs.jobs import STOPPED_TAG, WINDOW_TAG
from kimi_batch.engine import BatchOutcome
from kimi_batch.pipeline import generation_figures


def window_end(context: RunContext) -> datetime | None:
    """The run's nightly window end (its WINDOW_TAG), None without one."""
    raw = context.run.tags.get(WINDOW_TAG)
    if not raw:
        return None
    end = datetime.fromisoformat(raw)
    return end if end.tzinfo else end.replace(tzinfo=UTC)


def stopped_at_window(context: dg.AssetExecutionContext, outcome: BatchOutcome) -> dg.Failure:
    """The failure of an asset's partition that the nightly window cut short (the run marked
    so): it fails visibly with what is done, the next night's catch-up continues from the
    ledger."""
    stats = outcome.stats
    done = stats.generated + stats.from_ledger
    mark_stopped_at_window(context)
    return dg.Failure(
        f"the nightly window ended at {window_end(context)}: {done} of {stats.total} rows "
        "done, resumes next night",
        metadata={"rows_done": done, "rows_total": stats.total, **generation_figures(outcome)},
    )


# Dagster's run tag: whether run retries re-execute a run that failed in a step.
RETRY_ON_STEP_FAILURE_TAG = "dagster/retry_on_asset_or_op_failure"


def mark_stopped_at_window(context: RunContext) -> None:
    """Tag the run STOPPED_TAG=true (`status` and the morning alerts name it so) and not to be
    retried: past the window a retry would send nothing, the next night resumes the work."""
    context.instance.add_run_tags(
        context.run.run_id, {STOPPED_TAG: "true", RETRY_ON_STEP_FAILURE_TAG: "false"}
    )
