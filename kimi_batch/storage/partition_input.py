"""What a partition reads: its inbox file landed now, else its newest landed snapshot."""

from __future__ import annotations

import logging
from datetime import date
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.settings import Settings
from kimi_batch.storage.exceptions import StorageError
from kimi_batch.storage.inbox import NotRegularFileError, inspect_inbox_file
from kimi_batch.storage.landing import Assignment, LandedVersion, Landing
from kimi_batch.storage.settle import SETTLE_S, InputNotSettledError
from kimi_batch.storage.snapshot import InputTooLargeError

__all__ = ["LandingIOError", "ResolvedInput", "resolve_input", "resolve_partition"]

_log = logging.getLogger(__name__)


class LandingIOError(StorageError):
    """The inbox file could not be copied for a reason of the machine, not of its content (disk
    full, I/O error, permission): nothing is landed, and the step fails so that it is tried
    again, rather than the partition being emptied for good."""


class ResolvedInput(BaseModel):
    """What a partition reads: its newest landed version, and why anything was refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    assignment: Assignment
    version: LandedVersion | None = Field(description="None: nothing could ever be landed.")
    problem: str | None = Field(
        default=None, description="Why the inbox file was not landed now (quarantine reason)."
    )
    deferred: str | None = Field(
        default=None,
        description="Why the inbox file's new content waits for a later run (still changing); "
        "the partition reads its newest landed version meanwhile.",
    )
    from_inbox: bool = Field(description="The inbox file was there and is this version.")


def resolve_input(
    landing: Landing,
    inbox_dir: Path,
    ds: str,
    source: str,
    *,
    max_bytes: int,
    arrived: date,
    start: date,
    settle_s: float = SETTLE_S,
) -> ResolvedInput:
    """Land the partition's inbox file if it is there (a new version if it changed), else fall
    back to the newest landed snapshot: a partition never depends on the inbox after ingestion.

    Inbox files nothing has seen yet are assigned first (arriving on `arrived`), so a partition
    materialized by hand finds its file. Only what is wrong with the file itself (refused, too
    large, not a regular file) is a `problem` for the quarantine. A file still being written is
    skipped with a log line (`deferred`) and read again by a later run; with no earlier version
    that raises InputNotSettledError. An I/O error of the machine raises LandingIOError and lands
    nothing. Raises StorageError for a partition with no input.
    """
    if landing.assignment_for(ds, source) is None:
        landing.assign_inbox(inbox_dir, arrived=arrived, start=start)
    assignment = landing.assignment_for(ds, source)
    if assignment is None:
        raise StorageError(
            f"no input file was ever seen for partition date={ds} source={source} "
            "(the sensor, the schedule or the demo assign inbox files to partitions)"
        )
    item = inspect_inbox_file(inbox_dir, assignment.name)
    problem = deferred = None
    if item is None:
        problem = assignment.refused
    elif item.refused is not None:
        problem = item.refused
    else:
        try:
            version = landing.land(item.path, assignment, max_bytes=max_bytes, settle_s=settle_s)
        except (InputTooLargeError, NotRegularFileError) as error:
            problem = f"cannot land {assignment.name}: {error}"
        except InputNotSettledError as error:
            if landing.current(ds, source) is None:
                raise
            deferred = str(error)
            _log.warning("%s; reading the last landed version meanwhile", error)
        except FileNotFoundError:
            problem = assignment.refused  # gone between the look and the copy: the snapshot
        except OSError as error:
            raise LandingIOError(
                f"cannot land {assignment.name} ({type(error).__name__}: {error}); nothing was "
                "landed, the step fails so that a retry or a later run lands it"
            ) from error
        else:
            return ResolvedInput(assignment=assignment, version=version, from_inbox=True)
    return ResolvedInput(
        assignment=assignment,
        version=landing.current(ds, source),
        problem=problem,
        deferred=deferred,
        from_inbox=False,
    )


def resolve_partition(settings: Settings, ds: str, source: str) -> ResolvedInput:
    """`resolve_input` for the deployment's state dir, limits and clock."""
    with Landing(settings.paths) as landing:
        return resolve_input(
            landing,
            settings.paths.inbox_dir,
            ds,
            source,
            max_bytes=settings.max_input_bytes,
            arrived=settings.today(),
            start=settings.first_partition_date(),
        )
