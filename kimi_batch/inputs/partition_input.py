"""What a partition reads: its inbox file landed now, else its newest landed snapshot; and the
night's look at the whole inbox (`land_inbox`), which lands every settled file that changed."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.inputs.inbox import (
    InboxFile,
    InboxLinkError,
    inspect_inbox_file,
    scan_inbox,
    sha256_of,
)
from kimi_batch.inputs.landing import (
    SETTLE_S,
    Assignment,
    FileStat,
    InputNotSettledError,
    InputTooLargeError,
    LandedVersion,
    Landing,
    still_changing,
)
from kimi_batch.settings import Settings
from kimi_batch.storage import NotRegularFileError, StorageError

_log = logging.getLogger(__name__)

# A schedule tick is cut off after 60 s; the nightly look at the inbox hashes for this long at
# most (as the sensor's `HASH_BUDGET_S`), the rest the next look.
HASH_BUDGET_S = 30.0


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


def _assignment(
    landing: Landing, inbox_dir: Path, ds: str, source: str, *, arrived: date, start: date
) -> Assignment:
    """The partition's inbox file, assigning unseen inbox files first; StorageError if none."""
    if landing.assignment_for(ds, source) is None:
        landing.assign_inbox(inbox_dir, arrived=arrived, start=start)
    assignment = landing.assignment_for(ds, source)
    if assignment is None:
        raise StorageError(
            f"no input file was ever seen for partition date={ds} source={source} "
            "(the sensor, the schedule or the demo assign inbox files to partitions)"
        )
    return assignment


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
    assignment = _assignment(landing, inbox_dir, ds, source, arrived=arrived, start=start)
    item = inspect_inbox_file(inbox_dir, assignment.name)
    problem = deferred = None
    if item is None:
        problem = assignment.refused
    elif item.refused is not None:
        problem = item.refused
    else:
        try:
            version = landing.land(item, assignment, max_bytes=max_bytes, settle_s=settle_s)
        except (InputTooLargeError, NotRegularFileError, InboxLinkError) as error:
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
        version=landing.readable(landing.current(ds, source)),
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


class InboxLanding(BaseModel):
    """What one look at the whole inbox landed, and what it left for a later look."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    landed: list[LandedVersion] = Field(description="New versions landed by this look.")
    settling: list[str] = Field(description="Files still changing: landed by a later look.")
    problems: list[str] = Field(description="Files that could not be read (their run says why).")
    unread: list[str] = Field(
        default_factory=list,
        description="Files not hashed for want of time (`hash_budget_s`): read by a later look.",
    )
    hashed: int = Field(default=0, ge=0, description="Files this look read whole to hash.")


def _stat(path: Path) -> FileStat:
    """The stat of the file a read of inbox name `path` opens: a link inside the inbox is
    followed (`open_inbox_file`), so a rewrite of its target is a change (a link out of the
    inbox is refused before this, and on open)."""
    return _fingerprint(os.stat(path))


def _fingerprint(found: os.stat_result) -> FileStat:
    return (found.st_size, found.st_mtime_ns, found.st_ino, found.st_ctime_ns)


class _InboxLook:
    """One look at the inbox: hashes only files whose stat changed since their last hash, for
    at most `budget_s` once one file was read (the rest: `unread`)."""

    def __init__(self, landing: Landing, *, max_bytes: int, settle_s: float, budget_s: float):
        self.landing, self.max_bytes, self.settle_s = landing, max_bytes, settle_s
        self.deadline = time.monotonic() + budget_s
        self.landed: list[LandedVersion] = []
        self.unread: list[str] = []
        self.hashed = 0

    def look(self, item: InboxFile, assignment: Assignment) -> None:
        """Land `item` if its content is not its partition's newest version. OSError and
        StorageError (InputNotSettledError too) go to the caller."""
        stat = _stat(item.path)
        current = self.landing.current(assignment.ds, assignment.source)
        known = self.landing.fingerprint(item.name)
        if current is not None and known == (stat, current.sha256):
            return  # unchanged since it was hashed: not read again
        if self.hashed and time.monotonic() > self.deadline:
            self.unread.append(item.name)
            return
        self.hashed += 1
        # Hashed and copied from one descriptor, opened without following a link out.
        with item.open() as handle:
            sha256 = sha256_of(handle)
            if current is None or current.sha256 != sha256:
                version = self.landing.land(
                    item,
                    assignment,
                    max_bytes=self.max_bytes,
                    settle_s=self.settle_s,
                    handle=handle,
                )
                self.landed.append(version)
                sha256 = version.sha256
            # Remembered only when the file read is the one stat'ed, not changed while it was
            # read, and still what the name leads to.
            read = _fingerprint(os.fstat(handle.fileno()))
        if read == stat == _stat(item.path):
            self.landing.remember_fingerprint(item.name, stat, sha256)


def land_inbox(
    landing: Landing,
    inbox_dir: Path,
    *,
    max_bytes: int,
    arrived: date,
    start: date,
    accept_ds: Callable[[str], bool] = lambda ds: True,
    settle_s: float = SETTLE_S,
    hash_budget_s: float = HASH_BUDGET_S,
) -> InboxLanding:
    """Assign every inbox file, and land each settled one whose content is not its partition's
    newest landed version (a rewrite, or a return to an earlier content: A -> B -> A lands A
    again as the newest version), whether or not the inbox sensor runs.

    A settled file is hashed when its (size, mtime, inode, ctime) differ from those it had when
    last hashed (the manifest's fingerprints: of the file read, the target of a link inside
    the inbox), for `hash_budget_s` at most: what is left is `unread`, hashed by the next
    look. Only a changed file is copied. A file still changing is
    not waited for (`settling`); refused and over-size files, and files dated outside the
    partitions (`accept_ds`), are left to their partition's run, which quarantines them with
    the reason.
    """
    look = _InboxLook(landing, max_bytes=max_bytes, settle_s=settle_s, budget_s=hash_budget_s)
    settling: list[str] = []
    problems: list[str] = []
    for item in scan_inbox(inbox_dir):
        assignment = landing.assign_file(item, arrived=arrived, start=start)
        if item.refused or item.size > max_bytes or not accept_ds(assignment.ds):
            continue
        if still_changing((item.size, item.mtime_ns), time.time_ns(), settle_s):
            settling.append(item.name)
            continue
        try:
            look.look(item, assignment)
        except FileNotFoundError:
            continue  # gone since the listing: its partition reads its landed snapshot
        except InputNotSettledError:
            settling.append(item.name)
        except OSError as error:  # InputTooLargeError is a StorageError, caught below
            problems.append(f"{item.name}: {type(error).__name__}: {error}")
        except StorageError as error:
            problems.append(f"{item.name}: {error}")
    return InboxLanding(
        landed=look.landed,
        settling=settling,
        problems=problems,
        unread=look.unread,
        hashed=look.hashed,
    )
