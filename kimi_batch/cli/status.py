"""`kimi-batch status`: the server, the ledger, the partitions, the nightly run, the inbox, the
quality totals (answers set aside as duplicates or contaminated, the judge's scores) and each
table's newest snapshot with its night tag.

Read-only: nothing here starts a server, prefills a slot, writes to the Dagster instance or creates
a file or folder (a mistyped KIMI_BATCH_HOME stays absent), so the command is safe to run in a loop
while a night is in progress. Each section is collected on its own; a part that cannot be read (no
server, no instance yet, a corrupted ledger or manifest) says so in its section instead of failing
the rest. The document and its text are `kimi_batch.cli.status_sections`.

The Dagster instance is `DAGSTER_HOME`'s when it is set (a deployment sets it), else the state
dir's `dagster/`; one nothing ever ran in is not opened (nothing of Dagster's is printed). The
server is this state dir's: a llama-server another state dir started on the same port is named
as such, not reported as running here, and this dir's own server started with another spec than
the configuration asks is not called healthy (a run would refuse it).

A partition is stale when its distillation consumed another version of its input than the one
the night would read: the newest landed version, or the inbox file's content when that is
settled and differs (the night lands it; the inbox sensor need not run). So `status` hashes the
settled inbox files of known partitions; it never lands them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal

import dagster as dg
from pydantic import BaseModel, ValidationError
from sqlalchemy.exc import SQLAlchemyError

from kimi_batch.cli.status_quality import quality_section
from kimi_batch.cli.status_sections import (
    MAX_KEYS,
    DigestState,
    InboxSection,
    LedgerSection,
    NightlySection,
    NightRun,
    PartitionsSection,
    ServerSection,
    Status,
)
from kimi_batch.cli.status_tables import tables_section
from kimi_batch.defs.partition_states import (
    ACTIVE_RUN_STATUSES,
    PARTITION_TAG,
    distill_states,
    night_partitions,
)
from kimi_batch.defs.schedules import NIGHT_TAG, TRIGGER_TAG, build_nightly_schedule
from kimi_batch.engine import Ledger, load_digest
from kimi_batch.errors import ConfigError
from kimi_batch.inputs import InboxFile, landed_versions, scan_inbox, still_changing
from kimi_batch.llama import (
    AttachedServer,
    LlamaClient,
    LlamaError,
    ResidentServer,
    ServerSpec,
    ServerStatus,
    watched_server,
)
from kimi_batch.pipeline import PartitionRecord, PartitionState, stage_of_tag
from kimi_batch.settings import Settings
from kimi_batch.state import StateError, shown_location
from kimi_batch.storage import StorageError

_DIGEST_PREFILL = dg.AssetKey("digest_prefill")
# What a section that cannot be read fails with (corrupted sqlite files, an unreadable instance).
_UNREADABLE = (
    sqlite3.Error,
    StateError,
    OSError,
    SQLAlchemyError,
    dg.DagsterError,
    StorageError,
)
# Any start before now: the cron windows only serve to find the next tick (a yearly cron included).
_CRON_LOOKBACK = timedelta(days=400)


# ---- server -------------------------------------------------------------------------------------


def _server(settings: Settings, instance: dg.DagsterInstance | None) -> ServerSection:
    manager, problem = watched_server(settings)
    status = manager.status()
    not_ours = _not_this_homes(manager, status)
    if not_ours is not None:
        return ServerSection(
            running=False,
            healthy=False,
            pid=None,
            base_url=status.base_url,
            model=None,
            slots=None,
            slots_busy=None,
            slots_idle=None,
            digest=_digest_state(settings, instance, None),
            error=_joined(problem, not_ours),
        )
    busy: int | None = None
    error: str | None = _joined(problem, _other_spec(manager, status))
    if status.healthy and error is None:
        try:
            busy = asyncio.run(_busy_slots(manager.client()))
        except LlamaError as failure:
            error = str(failure)
    return ServerSection(
        running=status.running,
        healthy=status.healthy and error is None,
        pid=status.pid,
        base_url=status.base_url,
        model=status.model,
        slots=status.slots,
        slots_busy=busy,
        slots_idle=status.slots - busy if status.slots is not None and busy is not None else None,
        digest=_digest_state(settings, instance, status.started_at if status.running else None),
        error=error,
    )


def _joined(*problems: str | None) -> str | None:
    found = [problem for problem in problems if problem]
    return "; ".join(found) if found else None


def _not_this_homes(manager: ResidentServer | AttachedServer, status: ServerStatus) -> str | None:
    """Why what answers on the port is not this state dir's server (None: it is, or nothing
    answers). A server someone named (`KIMI_BATCH_LLAMA_URL`) is the configured one."""
    if not isinstance(manager, ResidentServer) or status.managed or not status.running:
        return None
    return (
        f"another llama-server answers at {status.base_url}, not started from this state dir "
        f"({manager.state_dir} has no live server); a run here attaches to it only if it serves "
        f"{manager.spec.model.name} with {manager.spec.slots} slots, else refuses it"
    )


def _other_spec(manager: ResidentServer | AttachedServer, status: ServerStatus) -> str | None:
    """Why this state dir's server cannot serve this configuration (None: it can)."""
    if not isinstance(manager, ResidentServer) or not status.managed:
        return None
    try:
        running = ServerSpec.model_validate_json(manager.spec_path.read_text())
    except (OSError, ValidationError):
        return None  # no spec recorded: nothing to compare
    if running == manager.spec:
        return None
    return (
        f"llama-server pid {status.pid} runs another spec than this configuration asks; a run "
        f"here refuses it (kimi-batch server stop, then start). running: {running.describe()}; "
        f"configured: {manager.spec.describe()}"
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
    except (OSError, ConfigError) as error:  # unreadable, or not UTF-8
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
    location = settings.paths.ledger_state
    path = shown_location(location)
    try:
        counts = Ledger.count_by_tag(location)
    except (sqlite3.Error, StateError) as error:
        return LedgerSection(
            path=path, rows=0, by_table={}, error=f"ledger {path} is unreadable: {error}"
        )
    by_table: Counter[str] = Counter()
    for tag, count in counts.items():
        by_table[_table_of(tag)] += count
    return LedgerSection(path=str(path), rows=sum(by_table.values()), by_table=dict(by_table))


def _table_of(tag: str) -> str:
    stage = stage_of_tag(tag)
    return stage.table if stage else "other"


# ---- Dagster instance: partitions and nights ----------------------------------------------------


def _dagster_home(settings: Settings) -> Path:
    """The Dagster instance's folder: `DAGSTER_HOME` when set (a deployment sets it), else the
    state dir's (`make dev`, the demo)."""
    configured = os.environ.get("DAGSTER_HOME")
    return Path(configured).expanduser() if configured else settings.paths.dagster_home


def _instance(settings: Settings) -> tuple[dg.DagsterInstance | None, str | None]:
    """The instance, or why there is none (absent, never used, unreadable).

    A folder with neither `dagster.yaml` nor run history is not opened: opening it would create
    Dagster's storage there (status writes nothing) and make Dagster warn about the missing
    `dagster.yaml`. Dagster's own log lines are kept out of the output either way.
    """
    home = _dagster_home(settings)
    if not home.is_dir():
        return None, f"no Dagster instance at {home}"
    if not (home / "dagster.yaml").is_file() and not (home / "history").is_dir():
        return None, f"no Dagster instance at {home} yet (no dagster.yaml, nothing ran there)"
    dagster_log = logging.getLogger("dagster")
    level = dagster_log.level
    dagster_log.setLevel(logging.ERROR)
    try:
        return dg.DagsterInstance.from_config(str(home)), None
    except _UNREADABLE as error:
        return None, f"Dagster instance at {home} is unreadable: {error}"
    finally:
        dagster_log.setLevel(level)


def _partitions(
    records: dict[str, PartitionRecord] | None, home: str, error: str | None
) -> PartitionsSection:
    if records is None:
        return PartitionsSection(dagster_home=None, error=error)
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
        stale=len(by_state[PartitionState.STALE]),
        keys={
            state.value: keys[:MAX_KEYS]
            for state, keys in by_state.items()
            if keys and state != PartitionState.DONE
        },
    )


def _schedule_state(
    schedule: dg.ScheduleDefinition, instance: dg.DagsterInstance | None
) -> Literal["running", "stopped", "unknown"]:
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


def _next_tick(cron: str, timezone: str, now: datetime) -> datetime:
    """The first tick after `now`, by Dagster's own cron windows: what the daemon will do."""
    windows = dg.TimeWindowPartitionsDefinition(
        cron_schedule=cron, start=now - _CRON_LOOKBACK, timezone=timezone, fmt="%Y-%m-%dT%H:%M"
    )
    key = windows.get_partition_key_for_timestamp(now.timestamp())
    return windows.time_window_for_partition_key(key).end


def _night_keys(runs: list[dg.DagsterRun]) -> list[str]:
    """The partitions a night's runs covered: a `nightly_job` run's from its run config, a
    one-partition run's (older nights, a rerun from the UI) from its partition tag."""
    keys: dict[str, None] = {}
    for run in runs:
        covered = night_partitions(run) or [run.tags.get(PARTITION_TAG, "")]
        keys.update((key, None) for key in covered if key)
    return list(keys)


def _last_night(
    instance: dg.DagsterInstance | None, records: dict[str, PartitionRecord] | None
) -> NightRun | None:
    if instance is None:
        return None
    runs = instance.get_runs(filters=dg.RunsFilter(tags={TRIGGER_TAG: "nightly"}), limit=500)
    if not runs:
        return None
    night = runs[0].tags.get(NIGHT_TAG)
    same = [run for run in runs if run.tags.get(NIGHT_TAG) == night]
    run_records = {
        record.dagster_run.run_id: record
        for record in instance.get_run_records(
            filters=dg.RunsFilter(run_ids=[run.run_id for run in same])
        )
    }
    starts = [r.start_time for r in run_records.values() if r.start_time is not None]
    ends = [r.end_time for r in run_records.values() if r.end_time is not None]
    active = any(run.status in ACTIVE_RUN_STATUSES for run in same)
    # One run covers the whole night: what it did is each of its partitions' state now.
    keys = _night_keys(same)
    known = records or {}
    states = Counter(
        (known[key].state if key in known else PartitionState.PENDING).value for key in keys
    )
    return NightRun(
        night=night,
        runs=len(same),
        statuses=dict(Counter(run.status.value for run in same)),
        partitions=len(keys),
        partition_states=dict(states),
        started=datetime.fromtimestamp(min(starts), UTC) if starts else None,
        ended=datetime.fromtimestamp(max(ends), UTC) if ends and not active else None,
    )


def _nightly(
    settings: Settings,
    instance: dg.DagsterInstance | None,
    records: dict[str, PartitionRecord] | None,
    now: datetime,
) -> NightlySection:
    schedule = build_nightly_schedule(settings)
    timezone = schedule.execution_timezone or "UTC"
    state = _schedule_state(schedule, instance)
    return NightlySection(
        cron=str(schedule.cron_schedule),
        timezone=timezone,
        schedule=state,
        next=_next_tick(str(schedule.cron_schedule), timezone, now) if state == "running" else None,
        last=_last_night(instance, records),
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


def _night_versions(files: list[InboxFile], manifest: _Manifest, max_bytes: int) -> dict[str, str]:
    """The version the night reads, by partition key: the settled inbox file's content where it
    differs from the newest landed one (the night lands it), else the newest landed one."""
    versions = dict(manifest.landed)
    now = time.time_ns()
    for item in files:
        key = manifest.key_of.get(item.name)
        if key is None or item.refused or item.size > max_bytes:
            continue  # unassigned: pending anyway; refused: quarantined by its run
        if still_changing((item.size, item.mtime_ns), now):
            continue
        try:
            versions[key] = item.hashed().sha256 or ""
        except OSError:
            continue  # unreadable now: its run says why
    return versions


def _refuse_garbled_start(settings: Settings) -> None:
    """The partitions' start date, as the definitions read it: a garbled one is a ConfigError
    (never reset to today); an absent one stays absent (status writes nothing)."""
    if settings.partitions_start is None and settings.paths.partitions_start_file.is_file():
        settings.first_partition_date()


def collect_status(settings: Settings, *, now: datetime | None = None) -> Status:
    """Every section, read from the state dir, the server and the Dagster instance."""
    now = now or datetime.now(UTC)
    paths = settings.paths
    files = scan_inbox(paths.inbox_dir) if paths.inbox_dir.is_dir() else []
    manifest = _manifest(settings)
    # A file nobody has seen yet has no partition: it waits under its name.
    key_of = {f.name: manifest.key_of.get(f.name) for f in files}
    instance, instance_error = _instance(settings)
    if instance is not None:
        _refuse_garbled_start(settings)
    records: dict[str, PartitionRecord] | None = None
    try:
        if instance is not None:
            try:
                versions = _night_versions(files, manifest, settings.max_input_bytes)
                records = distill_states(instance, manifest.key_of.values(), versions)
            except _UNREADABLE as error:
                instance_error = f"Dagster instance is unreadable: {error}"
        server = _server(settings, instance if records is not None else None)
        nightly = _nightly(settings, instance if records is not None else None, records, now)
    finally:
        if instance is not None:
            instance.dispose()
    # Without an instance nothing is known to be distilled: every file waits.
    waiting = sorted(
        name
        for name, key in key_of.items()
        if key is None
        or records is None
        or key not in records
        or records[key].state != PartitionState.DONE
    )
    return Status(
        server=server,
        ledger=_ledger(settings),
        partitions=_partitions(records, str(_dagster_home(settings)), instance_error),
        nightly=nightly,
        inbox=InboxSection(
            dir=str(paths.inbox_dir),
            files=len(files),
            waiting=len(waiting),
            waiting_files=waiting[:MAX_KEYS],
            error=manifest.error,
        ),
        quality=quality_section(settings),
        tables=tables_section(settings),
    )
