"""One tick of the inbox sensor, no Dagster: which inbox files to ask a run for, and under which
run key.

A tick lists the inbox (stat only) and hashes just the files whose (mtime, size) differ from the
cursor, so a tick over thousands of settled files reads none of them. The run key is the file's
inbox path, its content hash and how often that content was landed for the partition before
(`Landing.earlier_landings`; no suffix the first time): the daemon never starts a second run for a
key it has seen, so an unchanged file never runs twice (even after a cursor reset), a changed one
runs again, and a file reverted to an earlier content (A -> B -> A) gets a new key and lands A
again as the newest version: versions are events in time, not a set of contents. A file's
partition comes from the landing manifest: fixed when the sensor first sees it, never changed by
later files, and dated by its arrival in KIMI_BATCH_TIMEZONE, not by its mtime.

The cursor is the sensor's own memory; the manifest is the truth about what was landed, by
whoever landed it (the night's look at the inbox lands every changed file, the demo too). So a
content read is checked against its partition's landed state (`LandedState`): a content that is
the partition's newest version with its seeds written from it (`Landing.consumed`) is built
already and asks for no run (the night landed and built it before the sensor saw it); a content
the cursor knows but that is no longer the partition's newest (the night landed another version
in between, then the file came back: A -> B -> A) is a change, and asks for its run.

Hashing is bounded: a file over KIMI_BATCH_MAX_INPUT_MB is never read (its run quarantines it with
the reason), so one tick reads at most the budget plus one file of the maximum size. Refused
entries (a name that is not UTF-8, a symlink out of the inbox) are never read either.

A file that cannot be read is still requested, under a key made of its path, mtime and size, and
the `seed_prompts` run turns it into a quarantine row with the reason. Writing that row here
instead would put a warehouse write into the daemon process, outside any run, with no lineage
or UI trace; through a run it is one more materialization with metadata. A file that vanished
between the listing and the read is only logged. Either way the tick goes on.

With the state in PostgreSQL (KIMI_BATCH_DATABASE_URL), the sensor also lands each file it reads
before it asks for the file's run (`land_for_any_host`): the snapshot goes into the database, and
the run, on whatever host it is launched, reads it there. Only the code server then needs the
inbox. Landing is bounded like hashing: what is left over is asked for next tick. A file that
does not land here (an I/O error) is asked for anyway, and its run lands it or quarantines it
with the reason. On one box (SQLite state) the run lands the file, as it always did.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field, RootModel, ValidationError

from kimi_batch.inputs.inbox import InboxFile
from kimi_batch.inputs.landing import SETTLE_S, Assignment, Landing, still_changing
from kimi_batch.storage import StorageError

# Sensor evaluation is cut off after 60 s by default; hashing stops after this long and the rest
# of the files are picked up next tick (the cursor keeps what was done).
HASH_BUDGET_S = 30.0
# With the state shared by hosts, landing the files read stops after this long (the rest of the
# 60 s); what is left is asked for next tick.
LAND_BUDGET_S = 20.0
# A file whose content no run managed to land (an I/O error each time) is requested again after
# each failed run, at most this many runs in all, then left to a person (the alert names it).
MAX_LANDING_RUNS = 5


class InboxCursor(RootModel[dict[str, tuple[int, int, str | None]]]):
    """Sensor cursor: inbox path → [mtime_ns, size, sha256 or null when it could not be read]."""

    root: dict[str, tuple[int, int, str | None]] = Field(default_factory=dict)

    @classmethod
    def parse(cls, raw: str | None) -> InboxCursor:
        """The cursor from its JSON; empty when missing or unreadable (run keys still dedupe)."""
        if not raw:
            return cls()
        try:
            return cls.model_validate_json(raw)
        except ValidationError:
            return cls()

    def dump(self) -> str:
        return self.model_dump_json()


class InboxRequest(BaseModel):
    """A file to ingest and the run key it is requested under."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    file: InboxFile
    assignment: Assignment
    run_key: str = Field(min_length=1)


class InboxTick(BaseModel):
    """What one tick decided: runs to request, the next cursor, what to tell the user."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    requests: list[InboxRequest]
    cursor: InboxCursor
    warnings: list[str]
    unchanged: int = Field(ge=0, description="Files already seen with the same mtime and size.")
    built: int = Field(
        default=0, ge=0, description="Files read whose content is its partition's, built already."
    )
    deferred: int = Field(ge=0, description="Files left for a later tick (settling, budget).")


class LandedState(BaseModel):
    """What the manifest says of a partition: the sha256 of its newest landed version and the
    one its seeds were last written from (None: none)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    current: str | None = None
    consumed: str | None = None

    def built(self, sha256: str) -> bool:
        """`sha256` is the newest version and the partition's seeds were written from it."""
        return self.current == sha256 and self.consumed == sha256

    def superseded(self, sha256: str) -> bool:
        """Another content was landed as the newest version since `sha256`'s."""
        return self.current is not None and self.current != sha256


def landed_state(landing: Landing, assignment: Assignment) -> LandedState:
    """The partition's `LandedState` in the manifest."""
    current = landing.current(assignment.ds, assignment.source)
    return LandedState(
        current=current.sha256 if current else None,
        consumed=landing.consumed(assignment.ds, assignment.source),
    )


class IngestRun(BaseModel):
    """An earlier ingest run of a file's content, as `landing_retries` needs it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str
    in_flight: bool


_CursorEntry = tuple[int, int, str | None]


def plan_inbox_tick(
    files: Sequence[InboxFile],
    previous: InboxCursor,
    *,
    assign: Callable[[InboxFile], Assignment],
    is_valid_ds: Callable[[str], bool],
    max_input_bytes: int,
    earlier_landings: Callable[[Assignment, str], int] = lambda assignment, sha256: 0,
    landed: Callable[[Assignment], LandedState] = lambda assignment: LandedState(),
    now_ns: int | None = None,
    settle_s: float = SETTLE_S,
    hash_budget_s: float = HASH_BUDGET_S,
) -> InboxTick:
    """Decide which inbox files to request; reads only files new or changed since `previous`.

    `assign` gives a file's partition (the landing manifest: fixed at first sight);
    `earlier_landings` how often a content was landed for it before (`Landing.earlier_landings`),
    which makes a reverted file's run key new; `landed` the partition's state in the manifest
    (`landed_state`), which tells a content built already, or superseded since. Files over
    `max_input_bytes` and refused entries are requested without being read, under a key of their
    name, mtime and size, so their runs quarantine them with the reason.
    """
    planner = _TickPlanner(
        previous=previous.root,
        earlier_landings=earlier_landings,
        landed=landed,
        hash_budget_s=hash_budget_s,
    )
    now = time.time_ns() if now_ns is None else now_ns
    out_of_range: list[str] = []
    for item in files:
        entry = _previous_entry(planner.previous, item, max_input_bytes)
        if entry is not None and entry[:2] == (item.mtime_ns, item.size) and entry[2] is not None:
            planner.cursor[item.name] = entry
            planner.unchanged += 1
        elif still_changing((item.size, item.mtime_ns), now, settle_s):
            planner.deferred += 1
        else:
            assignment = assign(item)
            if assignment.clamped:
                planner.warnings.append(
                    f"{item.name}: dated {assignment.dated_ds}, before the first partition; "
                    f"landed on {assignment.ds}"
                )
            if not is_valid_ds(assignment.ds):
                # A date before the partitions start, or a dated folder for a day still to come:
                # asked for now it would fail the whole tick, so it waits outside the cursor.
                out_of_range.append(item.name)
                continue
            planner.take(item, entry, assignment, max_input_bytes)
    if out_of_range:
        planner.warnings.append(
            f"{len(out_of_range)} file(s) dated outside the date partitions, left for later: "
            + ", ".join(out_of_range[:5])
            + (" ..." if len(out_of_range) > 5 else "")
        )
    return planner.tick()


def _previous_entry(
    previous: dict[str, _CursorEntry], item: InboxFile, max_input_bytes: int
) -> _CursorEntry | None:
    """The file's entry in the last cursor; none for a file requested unread for its size that
    the limit now admits (its quarantine row says to raise the limit: that is enough)."""
    entry = previous.get(item.name)
    readable_now = item.refused is None and item.size <= max_input_bytes
    return None if entry is not None and entry[2] == "unread" and readable_now else entry


class _TickPlanner:
    """One tick's decisions so far: the next cursor, the requests, the warnings, the counts."""

    def __init__(
        self,
        *,
        previous: dict[str, _CursorEntry],
        earlier_landings: Callable[[Assignment, str], int],
        landed: Callable[[Assignment], LandedState],
        hash_budget_s: float,
    ) -> None:
        self.previous = previous
        self.earlier_landings = earlier_landings
        self.landed = landed
        self.hash_budget_s = hash_budget_s
        self.started = time.monotonic()
        self.cursor: dict[str, _CursorEntry] = {}
        self.requests: list[InboxRequest] = []
        self.warnings: list[str] = []
        self.unchanged = self.deferred = self.reads = self.built = 0

    def tick(self) -> InboxTick:
        """The tick decided."""
        return InboxTick(
            requests=self.requests,
            cursor=InboxCursor(self.cursor),
            warnings=self.warnings,
            unchanged=self.unchanged,
            built=self.built,
            deferred=self.deferred,
        )

    def take(
        self,
        item: InboxFile,
        entry: _CursorEntry | None,
        assignment: Assignment,
        max_input_bytes: int,
    ) -> None:
        """A settled file in range: request it unread, hash it, or leave it to the next tick."""
        unread = item.refused or (
            f"over the size limit ({item.size} bytes)" if item.size > max_input_bytes else None
        )
        if unread is not None:
            self._unread(item, entry, assignment, unread)
        elif self.reads and time.monotonic() - self.started > self.hash_budget_s:
            if entry is not None:
                self.cursor[item.name] = entry
            self.deferred += 1
        else:
            self.reads += 1
            self._hashed(item, entry, assignment)

    def _unread(
        self, item: InboxFile, entry: _CursorEntry | None, assignment: Assignment, why: str
    ) -> None:
        marker = (item.mtime_ns, item.size, "unread")
        if entry != marker:
            self.warnings.append(f"{item.name}: {why}; requesting its run to quarantine it")
            run_key = f"{item.name}:unread:{item.mtime_ns}:{item.size}"
            self.requests.append(InboxRequest(file=item, assignment=assignment, run_key=run_key))
        self.cursor[item.name] = marker

    def _hashed(self, item: InboxFile, entry: _CursorEntry | None, assignment: Assignment) -> None:
        same_stat = entry is not None and entry[:2] == (item.mtime_ns, item.size)
        try:
            read = item.hashed()
        except FileNotFoundError:
            self.warnings.append(f"{item.name} vanished before it could be read; skipped")
            return
        except Exception as error:  # one bad file must never stop the sensor
            self.cursor[item.name] = (item.mtime_ns, item.size, None)
            if same_stat:
                return  # already requested for quarantine; retried each tick in case it heals
            self.warnings.append(
                f"{item.name} cannot be read ({type(error).__name__}: {error}); "
                "requesting its run so that it is quarantined with the reason"
            )
            run_key = f"{item.name}:unreadable:{item.mtime_ns}:{item.size}"
            self.requests.append(InboxRequest(file=item, assignment=assignment, run_key=run_key))
            return
        sha256 = read.sha256 or ""
        self.cursor[item.name] = (item.mtime_ns, item.size, sha256)
        state = self.landed(assignment)
        if state.built(sha256):
            self.built += 1  # landed and built already (by the night, or an earlier run)
            return
        if entry is not None and entry[2] == sha256 and not state.superseded(sha256):
            self.unchanged += 1  # touched, not changed: same run key, nothing to do
            return
        again = self.earlier_landings(assignment, sha256)
        run_key = f"{item.name}:{sha256[:16]}" + (f":landed-again:{again}" if again else "")
        self.requests.append(InboxRequest(file=read, assignment=assignment, run_key=run_key))


def landing_retries(
    landing: Landing,
    files: Sequence[InboxFile],
    plan: InboxTick,
    runs_of: Mapping[tuple[str, str], Sequence[IngestRun]],
) -> list[InboxRequest]:
    """Settled, already-requested files whose content is not landed and whose last run ended
    (failed on an I/O error, or read an older version while the file was being written): asked
    for again, one run key per earlier run, so the next tick retries what a run could not do.
    `runs_of` holds the recent ingest runs by (inbox file, sha256), newest first."""
    requested = {request.file.name for request in plan.requests}
    retries: list[InboxRequest] = []
    for item in files:
        entry = plan.cursor.root.get(item.name)
        if item.name in requested or entry is None or entry[:2] != (item.mtime_ns, item.size):
            continue
        if entry[2] is None or entry[2] == "unread":
            continue  # refused or unreadable: quarantined by its run, not landed
        runs = runs_of.get((item.name, entry[2]), [])
        if not runs or len(runs) >= MAX_LANDING_RUNS or any(r.in_flight for r in runs):
            continue
        sha256 = entry[2]
        assignment = landing.assignment(item.name)
        current = landing.current(assignment.ds, assignment.source) if assignment else None
        # Landed means landed as the newest version: in A -> B -> A, A's day-1 landing does not
        # count for the A of day 3.
        if assignment is None or (current is not None and current.sha256 == sha256):
            continue
        retries.append(
            InboxRequest(
                file=item.model_copy(update={"sha256": sha256}),
                assignment=assignment,
                run_key=f"{item.name}:{sha256[:16]}:after:{runs[0].run_id[:8]}",
            )
        )
    return retries


def land_for_any_host(
    landing: Landing,
    plan: InboxTick,
    previous: InboxCursor,
    *,
    max_input_bytes: int,
    budget_s: float = LAND_BUDGET_S,
) -> InboxTick:
    """Land each requested file that was read (see the module docstring); a file left over when
    `budget_s` is spent goes back to its previous cursor entry, so next tick asks again."""
    started = time.monotonic()
    cursor, warnings = dict(plan.cursor.root), list(plan.warnings)
    requests: list[InboxRequest] = []
    deferred = landed = 0
    for request in plan.requests:
        name = request.file.name
        if request.file.sha256 is None:  # not read: its run quarantines it, reading nothing
            requests.append(request)
            continue
        if landed and time.monotonic() - started > budget_s:
            if (entry := previous.root.get(name)) is None:
                cursor.pop(name, None)
            else:
                cursor[name] = entry
            deferred += 1
            continue
        try:
            landing.land(
                request.file,
                request.assignment,
                max_bytes=max_input_bytes,
                settle_s=0.0,  # settled: the plan read it only once it had stood still
            )
        except (StorageError, OSError) as error:
            warnings.append(f"{name}: not landed by the sensor ({error}); its run lands it")
        landed += 1
        requests.append(request)
    return plan.model_copy(
        update={
            "requests": requests,
            "cursor": InboxCursor(cursor),
            "warnings": warnings,
            "deferred": plan.deferred + deferred,
        }
    )
