"""`kimi-batch status`: the server, the ledger, the partitions, the nightly run and the inbox.

Read-only: nothing here starts a server, prefills a slot, writes to the Dagster instance or creates
a file or folder (a mistyped KIMI_BATCH_HOME stays absent), so the command is safe to run in a loop
while a night is in progress. Each section is collected on its own; a part that cannot be read (no
server, no instance yet, a corrupted ledger or manifest) says so in its section instead of failing
the rest. The Dagster definitions are imported only once an instance exists: importing them fixes
the install's first partition date, a write.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections import Counter
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Literal

import dagster as dg
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.exc import SQLAlchemyError

from kimi_batch.engine import load_digest
from kimi_batch.llama import LlamaClient, LlamaError, server_from_settings
from kimi_batch.settings import Settings
from kimi_batch.storage import StorageError, landed_versions, scan_inbox
from kimi_batch.tasks.stages import stage_of_tag

__all__ = [
    "DigestState",
    "InboxSection",
    "LedgerSection",
    "NightlySection",
    "PartitionsSection",
    "ServerSection",
    "Status",
    "collect_status",
    "render_status",
]

if TYPE_CHECKING:
    from kimi_batch.defs.partition_states import PartitionRecord

# Partition keys listed per state; the counts stay exact.
MAX_KEYS = 20
_DIGEST_PREFILL = dg.AssetKey("digest_prefill")
# What a section that cannot be read fails with (corrupted sqlite files, an unreadable instance).
_UNREADABLE = (sqlite3.Error, OSError, SQLAlchemyError, dg.DagsterError, StorageError)
# The states `partition_states.PartitionState` names, listed without importing the definitions.
_STATES = ("done", "pending", "running", "failed", "stopped_at_window", "stale")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DigestState(_Section):
    sha256: str | None
    restored: bool | None = Field(
        description="digest_prefill ran for this digest since the server started (a restore, or "
        "the one prefill); None when that cannot be known (no instance, an attached server)."
    )
    detail: str = ""


class ServerSection(_Section):
    running: bool
    healthy: bool
    pid: int | None
    base_url: str
    model: str | None
    slots: int | None
    slots_busy: int | None
    slots_idle: int | None
    digest: DigestState
    error: str | None = None


class LedgerSection(_Section):
    path: str
    rows: int
    by_table: dict[str, int] = Field(description="Finished requests by the table they feed.")
    error: str | None = None


class PartitionsSection(_Section):
    """States of the `distilled_responses` partitions (date|source) the instance knows of."""

    dagster_home: str | None
    done: int = 0
    pending: int = 0
    running: int = 0
    failed: int = 0
    stopped_at_window: int = 0
    stale: int = Field(default=0, description="Distilled from an older version of the input.")
    keys: dict[str, list[str]] = Field(
        default_factory=dict, description=f"Keys per state except done (at most {MAX_KEYS})."
    )
    error: str | None = None


class NightRun(_Section):
    night: str | None
    runs: int
    statuses: dict[str, int]
    started: datetime | None
    ended: datetime | None


class NightlySection(_Section):
    cron: str
    timezone: str
    schedule: Literal["running", "stopped", "unknown"]
    next: datetime | None = Field(description="Next tick, when the schedule is running.")
    last: NightRun | None


class InboxSection(_Section):
    dir: str
    files: int
    waiting: int = Field(description="Files whose partition is not distilled yet.")
    waiting_files: list[str]
    error: str | None = None


class Status(_Section):
    server: ServerSection
    ledger: LedgerSection
    partitions: PartitionsSection
    nightly: NightlySection
    inbox: InboxSection


# ---- server -------------------------------------------------------------------------------------


def _server(settings: Settings, instance: dg.DagsterInstance | None) -> ServerSection:
    manager = server_from_settings(settings)
    status = manager.status()
    busy: int | None = None
    error: str | None = None
    if status.healthy:
        try:
            busy = asyncio.run(_busy_slots(manager.client()))
        except LlamaError as failure:
            error = str(failure)
    return ServerSection(
        running=status.running,
        healthy=status.healthy,
        pid=status.pid,
        base_url=status.base_url,
        model=status.model,
        slots=status.slots,
        slots_busy=busy,
        slots_idle=status.slots - busy if status.slots is not None and busy is not None else None,
        digest=_digest_state(settings, instance, status.started_at if status.running else None),
        error=error,
    )


async def _busy_slots(client: LlamaClient) -> int:
    async with client:
        return sum(1 for slot in await client.slots() if slot.is_processing)


def _digest_state(
    settings: Settings, instance: dg.DagsterInstance | None, started_at: float | None
) -> DigestState:
    """Whether the slots were given the digest since the server started.

    llama-server does not show what a slot holds, and asking (a canary request) would prefill a
    cold slot: ~44 minutes on the target. So this reads the record instead: the last
    `digest_prefill` materialization, its digest and its time against the server's start.
    """
    try:
        sha = load_digest(settings.digest).sha256
    except OSError as error:
        return DigestState(sha256=None, restored=None, detail=str(error))
    if instance is None or started_at is None:
        return DigestState(
            sha256=sha, restored=None, detail="no managed server or no Dagster instance"
        )
    event = instance.get_latest_materialization_event(_DIGEST_PREFILL)
    materialization = event.asset_materialization if event else None
    if event is None or materialization is None:
        return DigestState(sha256=sha, restored=False, detail="digest_prefill never ran")
    value = materialization.metadata.get("digest_sha256")
    prefilled_sha = getattr(value, "value", value)
    when = datetime.fromtimestamp(event.timestamp, UTC)
    if prefilled_sha != sha:
        return DigestState(
            sha256=sha, restored=False, detail=f"digest_prefill at {when:%F %T} was another digest"
        )
    if event.timestamp < started_at:
        return DigestState(
            sha256=sha,
            restored=False,
            detail=f"digest_prefill at {when:%F %T} is older than the server",
        )
    return DigestState(sha256=sha, restored=True, detail=f"digest_prefill at {when:%F %T} UTC")


# ---- ledger -------------------------------------------------------------------------------------


def _ledger(settings: Settings) -> LedgerSection:
    path = settings.paths.ledger_path
    if not path.is_file():
        return LedgerSection(path=str(path), rows=0, by_table={})
    # Read-only, so a status call never holds a write lock beside a running batch.
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
        try:
            rows = db.execute(
                "SELECT json_extract(result_json, '$.tag'), count(*) FROM results GROUP BY 1"
            ).fetchall()
        finally:
            db.close()
    except sqlite3.Error as error:
        return LedgerSection(
            path=str(path), rows=0, by_table={}, error=f"ledger {path} is unreadable: {error}"
        )
    by_table: Counter[str] = Counter()
    for tag, count in rows:
        by_table[_table_of(str(tag or ""))] += int(count)
    return LedgerSection(path=str(path), rows=sum(by_table.values()), by_table=dict(by_table))


def _table_of(tag: str) -> str:
    stage = stage_of_tag(tag)
    return stage.table if stage else "other"


# ---- Dagster instance: partitions and nights ----------------------------------------------------


def _instance(settings: Settings) -> tuple[dg.DagsterInstance | None, str | None]:
    """The instance, or why there is none (absent, unreadable)."""
    home = settings.paths.dagster_home
    if not home.is_dir():
        return None, f"no Dagster instance at {home}"
    try:
        return dg.DagsterInstance.from_config(str(home)), None
    except _UNREADABLE as error:
        return None, f"Dagster instance at {home} is unreadable: {error}"


def _records(
    instance: dg.DagsterInstance, keys: Iterable[str], landed: dict[str, str]
) -> dict[str, PartitionRecord]:
    from kimi_batch.defs.partition_states import distill_states

    return distill_states(instance, keys, landed)


def _partitions(
    records: dict[str, PartitionRecord] | None, home: str, error: str | None
) -> PartitionsSection:
    if records is None:
        return PartitionsSection(dagster_home=None, error=error)
    by_state: dict[str, list[str]] = {state: [] for state in _STATES}
    for record in records.values():
        by_state[record.state.value].append(record.key)
    counts = {state: len(keys) for state, keys in by_state.items()}
    return PartitionsSection(
        dagster_home=home,
        done=counts["done"],
        pending=counts["pending"],
        running=counts["running"],
        failed=counts["failed"],
        stopped_at_window=counts["stopped_at_window"],
        stale=counts["stale"],
        keys={
            state: keys[:MAX_KEYS] for state, keys in by_state.items() if keys and state != "done"
        },
    )


def _schedule_state(
    settings: Settings, instance: dg.DagsterInstance | None
) -> Literal["running", "stopped", "unknown"]:
    default = "running" if settings.nightly_running else "stopped"
    if instance is None:
        return default
    from kimi_batch.defs.schedules import nightly_distillation_schedule as schedule

    storage = instance.schedule_storage
    if storage is None:
        return "unknown"
    for found in storage.all_instigator_state():
        if found.name == schedule.name:
            return "running" if found.status.value == "RUNNING" else "stopped"
    return default


def _next_tick(cron: str, timezone: str, now: datetime) -> datetime | None:
    # Dagster's own cron iterator, so "next" means exactly what the daemon will do.
    from dagster._utils.schedules import cron_string_iterator

    for tick in cron_string_iterator(now.timestamp(), cron, timezone):
        if tick.timestamp() > now.timestamp():
            return tick
    return None


def _last_night(instance: dg.DagsterInstance | None) -> NightRun | None:
    if instance is None:
        return None
    from kimi_batch.defs.partition_states import ACTIVE_RUN_STATUSES
    from kimi_batch.defs.schedules import NIGHT_TAG, TRIGGER_TAG

    runs = instance.get_runs(filters=dg.RunsFilter(tags={TRIGGER_TAG: "nightly"}), limit=500)
    if not runs:
        return None
    night = runs[0].tags.get(NIGHT_TAG)
    same = [run for run in runs if run.tags.get(NIGHT_TAG) == night]
    records = {
        record.dagster_run.run_id: record
        for record in instance.get_run_records(
            filters=dg.RunsFilter(run_ids=[run.run_id for run in same])
        )
    }
    starts = [r.start_time for r in records.values() if r.start_time is not None]
    ends = [r.end_time for r in records.values() if r.end_time is not None]
    active = any(run.status in ACTIVE_RUN_STATUSES for run in same)
    return NightRun(
        night=night,
        runs=len(same),
        statuses=dict(Counter(run.status.value for run in same)),
        started=datetime.fromtimestamp(min(starts), UTC) if starts else None,
        ended=datetime.fromtimestamp(max(ends), UTC) if ends and not active else None,
    )


def _nightly(
    settings: Settings, instance: dg.DagsterInstance | None, now: datetime
) -> NightlySection:
    # The schedule is built from these settings (defs/schedules.py).
    cron, timezone = settings.nightly_cron, settings.timezone
    state = _schedule_state(settings, instance)
    return NightlySection(
        cron=cron,
        timezone=timezone,
        schedule=state,
        next=_next_tick(cron, timezone, now) if state == "running" else None,
        last=_last_night(instance),
    )


# ---- inbox and the whole ------------------------------------------------------------------------


class _Manifest(BaseModel):
    """What the landing manifest says: each inbox name's partition and its newest landed sha."""

    key_of: dict[str, str] = {}
    landed: dict[str, str] = {}
    error: str | None = None


def _manifest(settings: Settings) -> _Manifest:
    try:
        versions = landed_versions(settings.paths)
    except StorageError as error:
        return _Manifest(error=str(error))
    # The key format of the date|source partitions (a MultiPartitionKey: dimensions by name).
    key_of = {item.name: f"{item.ds}|{item.source}" for item, _ in versions}
    landed = {f"{item.ds}|{item.source}": sha for item, sha in versions if sha}
    return _Manifest(key_of=key_of, landed=landed)


def collect_status(settings: Settings, *, now: datetime | None = None) -> Status:
    """Every section, read from the state dir, the server and the Dagster instance."""
    now = now or datetime.now(UTC)
    paths = settings.paths
    files = scan_inbox(paths.inbox_dir) if paths.inbox_dir.is_dir() else []
    manifest = _manifest(settings)
    # A file nobody has seen yet has no partition: it waits under its name.
    key_of = {f.name: manifest.key_of.get(f.name) for f in files}
    instance, instance_error = _instance(settings)
    records: dict[str, PartitionRecord] | None = None
    try:
        if instance is not None:
            try:
                records = _records(instance, manifest.key_of.values(), manifest.landed)
            except _UNREADABLE as error:
                instance_error = f"Dagster instance is unreadable: {error}"
        server = _server(settings, instance if records is not None else None)
        nightly = _nightly(settings, instance if records is not None else None, now)
    finally:
        if instance is not None:
            instance.dispose()
    # Without an instance nothing is known to be distilled: every file waits.
    waiting = sorted(
        name
        for name, key in key_of.items()
        if key is None or records is None or key not in records or records[key].state != "done"
    )
    return Status(
        server=server,
        ledger=_ledger(settings),
        partitions=_partitions(records, str(settings.paths.dagster_home), instance_error),
        nightly=nightly,
        inbox=InboxSection(
            dir=str(paths.inbox_dir),
            files=len(files),
            waiting=len(waiting),
            waiting_files=waiting[:MAX_KEYS],
            error=manifest.error,
        ),
    )


def render_status(status: Status) -> str:
    """One screen of text."""
    server, digest = status.server, status.server.digest
    lines = []
    if server.running:
        lines.append(
            f"server     {'healthy' if server.healthy else 'not healthy'} pid={server.pid} "
            f"{server.base_url} model={server.model} slots {server.slots_busy} busy / "
            f"{server.slots_idle} idle"
        )
    else:
        lines.append(f"server     not running ({server.base_url})")
    restored = {True: "restored", False: "NOT restored", None: "unknown"}[digest.restored]
    lines.append(f"digest     {(digest.sha256 or '?')[:12]} {restored} ({digest.detail})")
    tables = ", ".join(f"{name} {rows}" for name, rows in sorted(status.ledger.by_table.items()))
    lines.append(
        f"ledger     {status.ledger.error}"
        if status.ledger.error
        else f"ledger     {status.ledger.rows} rows ({tables or 'empty'})"
    )
    parts = status.partitions
    if parts.dagster_home is None:
        lines.append(f"partitions {parts.error}")
    else:
        lines.append(
            f"partitions {parts.done} done, {parts.pending} pending, {parts.running} running, "
            f"{parts.failed} failed, {parts.stopped_at_window} stopped at the nightly window, "
            f"{parts.stale} stale (input changed since)"
        )
        for name in ("failed", "stopped_at_window", "stale", "running", "pending"):
            if parts.keys.get(name):
                lines.append(f"  {name}: {', '.join(parts.keys[name])}")
    nightly = status.nightly
    last = nightly.last
    last_text = (
        f"last night {last.night}: {last.runs} run(s) {last.statuses}"
        if last
        else "no nightly run yet"
    )
    next_text = nightly.next.isoformat() if nightly.next else f"schedule {nightly.schedule}"
    lines.append(f"nightly    {nightly.cron} {nightly.timezone}; next {next_text}; {last_text}")
    inbox = status.inbox
    lines.append(f"inbox      {inbox.files} file(s), {inbox.waiting} waiting ({inbox.dir})")
    if inbox.error:
        lines.append(f"  {inbox.error}")
    if inbox.waiting_files:
        lines.append(f"  waiting: {', '.join(inbox.waiting_files)}")
    return "\n".join(lines)
