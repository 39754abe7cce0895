"""The `kimi-batch status` document: one model per section, and its one-screen text."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# Partition keys listed per state; the counts stay exact.
MAX_KEYS = 20


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
    """The last night: its run (one `nightly_job` run a night; more after a rerun or on nights
    from before it) and what became of each of its partitions."""

    night: str | None
    runs: int
    statuses: dict[str, int] = Field(description="The night's runs by run status.")
    partitions: int = Field(default=0, description="Partitions the night's runs covered.")
    partition_states: dict[str, int] = Field(
        default_factory=dict,
        description="Those partitions by their state now (done, failed, stopped_at_window, ...).",
    )
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


class QualitySection(_Section):
    """What the quality gate kept out of training, over every partition, and the judge's scores."""

    dedup: bool = Field(description="Duplicate removal is on (KIMI_BATCH_DEDUP).")
    indexed: int = Field(default=0, description="Kept answers in the duplicate index.")
    duplicates: int = Field(default=0, description="Answers set aside as exact repeats.")
    near_duplicates: int = Field(default=0, description="Answers set aside as near-duplicates.")
    contaminated: int = Field(
        default=0, description="Answers set aside as sharing an n-gram with a benchmark item."
    )
    benchmarks: list[str] = Field(description="Benchmark files (KIMI_BATCH_BENCHMARKS).")
    judged: int = Field(default=0, description="Answers the judge stage scored.")
    judge_scores: dict[int, int] = Field(
        default_factory=dict, description="Judged answers by score (1-10)."
    )
    error: str | None = None


class TableState(_Section):
    """A table's current snapshot and its newest night tag."""

    snapshot_id: int
    committed_at: datetime
    night_tag: str | None = Field(description="The newest night-YYYY-MM-DD tag of the table.")
    night_snapshot_id: int | None = Field(description="The snapshot that tag names.")


class TablesSection(_Section):
    """The warehouse's Iceberg tables by name (tables never written are absent)."""

    warehouse: str
    tables: dict[str, TableState] = Field(default_factory=dict)
    error: str | None = None


class Status(_Section):
    server: ServerSection
    ledger: LedgerSection
    partitions: PartitionsSection
    nightly: NightlySection
    inbox: InboxSection
    quality: QualitySection
    tables: TablesSection


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{count} {name}" for name, count in sorted(counts.items())) or "none"


def render_status(status: Status) -> str:
    """One screen of text."""
    server, digest = status.server, status.server.digest
    lines = []
    if server.running:
        lines.append(
            f"server     {'healthy' if server.healthy else 'not healthy'} pid={server.pid} "
            f"{server.base_url} model={server.model} slots {server.slots_busy} busy / "
            f"{server.slots_idle} idle" + (f"; {server.error}" if server.error else "")
        )
    else:
        detail = f"; {server.error}" if server.error else ""
        lines.append(f"server     not running ({server.base_url}){detail}")
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
        f"last night {last.night}: {last.partitions} partition(s) "
        f"({_counts(last.partition_states)}) in {last.runs} run(s) ({_counts(last.statuses)})"
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
    lines.append(_quality_line(status.quality))
    lines.extend(_table_lines(status.tables))
    return "\n".join(lines)


def _table_lines(section: TablesSection) -> list[str]:
    if section.error:
        return [f"tables     {section.error}"]
    if not section.tables:
        return [f"tables     none written yet ({section.warehouse})"]
    lines = [f"tables     {len(section.tables)} Iceberg table(s) ({section.warehouse})"]
    for name, state in sorted(section.tables.items()):
        when = state.committed_at.isoformat(timespec="seconds")
        night = state.night_tag or "no night tag"
        if state.night_tag and state.night_snapshot_id != state.snapshot_id:
            night += f" on {state.night_snapshot_id}"
        lines.append(f"  {name}: snapshot {state.snapshot_id} of {when}; {night}")
    return lines


def _quality_line(quality: QualitySection) -> str:
    if quality.error:
        return f"quality    {quality.error}"
    dedup = f"dedup on, {quality.indexed} kept answers indexed" if quality.dedup else "dedup off"
    benchmarks = f"{len(quality.benchmarks)} benchmark file(s)" if quality.benchmarks else "none"
    line = (
        f"quality    {dedup}; set aside {quality.duplicates} duplicate, "
        f"{quality.near_duplicates} near-duplicate, {quality.contaminated} contaminated "
        f"(benchmarks: {benchmarks})"
    )
    if quality.judged:
        scores = " ".join(f"{score}:{n}" for score, n in sorted(quality.judge_scores.items()))
        line += f"; judged {quality.judged} (scores {scores})"
    return line
