"""`kimi-batch status`: the server, the ledger, the partitions, the nightly run and the inbox.

Read-only: nothing here starts a server, prefills a slot or writes to the Dagster instance, so the
command is safe to run in a loop while a night is in progress. Each section is collected on its
own; a part that cannot be read (no server, no instance yet) says so instead of failing the rest.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections import Counter
from datetime import UTC, datetime
from typing import Literal

import dagster as dg
from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.defs.partition_states import (
    ACTIVE_RUN_STATUSES,
    PartitionRecord,
    PartitionState,
    distill_states,
)
from kimi_batch.defs.partitions import DATE_DIMENSION, SOURCE_DIMENSION
from kimi_batch.defs.schedules import NIGHT_TAG, TRIGGER_TAG, nightly_distillation_schedule
from kimi_batch.engine import load_digest
from kimi_batch.llama import LlamaClient, LlamaError, server_from_settings
from kimi_batch.settings import Settings
from kimi_batch.storage import Landing, scan_inbox
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

# Partition keys listed per state; the counts stay exact.
MAX_KEYS = 20
_DIGEST_PREFILL = dg.AssetKey("digest_prefill")


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


class PartitionsSection(_Section):
    """States of the `distilled_responses` partitions (date|source) the instance knows of."""

    dagster_home: str | None
    done: int = 0
    pending: int = 0
    running: int = 0
    failed: int = 0
    stopped_at_window: int = 0
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
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        rows = db.execute(
            "SELECT json_extract(result_json, '$.tag'), count(*) FROM results GROUP BY 1"
        ).fetchall()
    finally:
        db.close()
    by_table: Counter[str] = Counter()
    for tag, count in rows:
        by_table[_table_of(str(tag or ""))] += int(count)
    return LedgerSection(path=str(path), rows=sum(by_table.values()), by_table=dict(by_table))


def _table_of(tag: str) -> str:
    stage = stage_of_tag(tag)
    return stage.table if stage else "other"


# ---- Dagster instance: partitions and nights ----------------------------------------------------


def _instance(settings: Settings) -> dg.DagsterInstance | None:
    home = settings.paths.dagster_home
    if not home.is_dir():
        return None
    return dg.DagsterInstance.from_config(str(home))


def _partitions(records: dict[str, PartitionRecord] | None, home: str) -> PartitionsSection:
    if records is None:
        return PartitionsSection(dagster_home=None, error=f"no Dagster instance at {home}")
    by_state: dict[PartitionState, list[str]] = {state: [] for state in PartitionState}
    for record in records.values():
        by_state[record.state].append(record.key)
    return PartitionsSection(
        dagster_home=home,
        done=len(by_state[PartitionState.DONE]),
        pending=len(by_state[PartitionState.PENDING]),
        running=len(by_state[PartitionState.RUNNING]),
        failed=len(by_state[PartitionState.FAILED]),
        stopped_at_window=len(by_state[PartitionState.STOPPED_AT_WINDOW]),
        keys={
            state.value: keys[:MAX_KEYS]
            for state, keys in by_state.items()
            if keys and state != PartitionState.DONE
        },
    )


def _schedule_state(
    instance: dg.DagsterInstance | None,
) -> Literal["running", "stopped", "unknown"]:
    schedule = nightly_distillation_schedule
    default = (
        "running" if schedule.default_status == dg.DefaultScheduleStatus.RUNNING else "stopped"
    )
    if instance is None:
        return default
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


def _nightly(instance: dg.DagsterInstance | None, now: datetime) -> NightlySection:
    schedule = nightly_distillation_schedule
    timezone = schedule.execution_timezone or "UTC"
    state = _schedule_state(instance)
    return NightlySection(
        cron=str(schedule.cron_schedule),
        timezone=timezone,
        schedule=state,
        next=_next_tick(str(schedule.cron_schedule), timezone, now) if state == "running" else None,
        last=_last_night(instance),
    )


# ---- inbox and the whole ------------------------------------------------------------------------


def _assignments(settings: Settings) -> dict[str, str]:
    """Inbox name -> partition key, from the landing manifest when there is one."""
    manifest = settings.paths.manifest_path
    if not manifest.is_file():
        return {}
    with Landing(settings.paths) as landing:
        return {
            item.name: str(
                dg.MultiPartitionKey({DATE_DIMENSION: item.ds, SOURCE_DIMENSION: item.source})
            )
            for item in landing.assignments()
        }


def collect_status(settings: Settings, *, now: datetime | None = None) -> Status:
    """Every section, read from the state dir, the server and the Dagster instance."""
    now = now or datetime.now(UTC)
    paths = settings.paths
    files = scan_inbox(paths.inbox_dir) if paths.inbox_dir.is_dir() else []
    assigned = _assignments(settings)
    # A file nobody has seen yet has no partition: it waits under its name.
    key_of = {f.name: assigned.get(f.name) for f in files}
    instance = _instance(settings)
    try:
        records = distill_states(instance, assigned.values()) if instance is not None else None
        server = _server(settings, instance)
        nightly = _nightly(instance, now)
    finally:
        if instance is not None:
            instance.dispose()
    # Without an instance nothing is known to be distilled: every file waits.
    waiting = sorted(
        name
        for name, key in key_of.items()
        if key is None or records is None or records[key].state != PartitionState.DONE
    )
    return Status(
        server=server,
        ledger=_ledger(settings),
        partitions=_partitions(records, str(settings.paths.dagster_home)),
        nightly=nightly,
        inbox=InboxSection(
            dir=str(paths.inbox_dir),
            files=len(files),
            waiting=len(waiting),
            waiting_files=waiting[:MAX_KEYS],
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
    lines.append(f"ledger     {status.ledger.rows} rows ({tables or 'empty'})")
    parts = status.partitions
    if parts.dagster_home is None:
        lines.append(f"partitions {parts.error}")
    else:
        lines.append(
            f"partitions {parts.done} done, {parts.pending} pending, {parts.running} running, "
            f"{parts.failed} failed, {parts.stopped_at_window} stopped at the nightly window"
        )
        for name in ("failed", "stopped_at_window", "running", "pending"):
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
    if inbox.waiting_files:
        lines.append(f"  waiting: {', '.join(inbox.waiting_files)}")
    return "\n".join(lines)
