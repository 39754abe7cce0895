"""`kimi-batch bench --workload maintenance`: 30 simulated nights of commits and maintenance.

Each night overwrites `partitions` partitions of every output table (the new day and the days
before it, as reruns of stale partitions do), one commit each, tags the night's snapshot
(`night-YYYY-MM-DD`, kept by maintenance), then maintains the tables with the nights as the clock:
snapshots older than `retention_nights` nights expire, unreferenced files go. No server: the
rows are synthetic (a few columns filled, the rest null). Measured: the median partition commit
time on night 1 and on the last night, each table's current metadata file, manifests and
snapshots at the end. Issue 43 asks for the last night's commit within 2x the first's and every
metadata file under 1 MB.
"""

from __future__ import annotations

import json
import shutil
import statistics
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
from pydantic import BaseModel, Field

from kimi_batch.settings import Settings
from kimi_batch.warehouse import TABLES, TableMaintenance, Warehouse, maintain, polars_schema

__all__ = [
    "MaintenanceBenchOptions",
    "maintenance_table",
    "run_maintenance_bench",
    "write_maintenance_outputs",
]

_FIRST_NIGHT = date(2026, 1, 1)


class MaintenanceBenchOptions(BaseModel):
    nights: int = Field(default=30, ge=2)
    partitions: int = Field(default=6, ge=1)  # overwritten per table per night
    rows: int = Field(default=50, ge=1)  # per partition
    retention_nights: int = Field(default=7, ge=1)


def _frame(table: str, rows: int, night: int) -> pl.DataFrame:
    """Synthetic rows: text and integer columns filled, the others null."""
    columns: dict[str, Any] = {}
    for name, dtype in polars_schema(table).items():
        if dtype == pl.String:
            columns[name] = [f"{name}-{night}-{i}" for i in range(rows)]
        elif dtype.is_integer():
            columns[name] = list(range(rows))
    return pl.DataFrame(columns)


def _night(warehouse: Warehouse, night: int, options: MaintenanceBenchOptions) -> list[float]:
    """One night's commits (seconds each), then its tag on every table."""
    day = _FIRST_NIGHT + timedelta(days=night)
    took = []
    for table in TABLES:
        for back in range(options.partitions):
            ds = (day - timedelta(days=back)).isoformat()
            frame = _frame(table, options.rows, night)
            started = time.perf_counter()
            warehouse.write_frame(table, ds, "bench", frame)
            took.append(time.perf_counter() - started)
        iceberg = warehouse.iceberg_table(table)
        snapshot = iceberg.metadata.current_snapshot_id if iceberg else None
        if iceberg is not None and snapshot is not None:
            iceberg.manage_snapshots().create_tag(snapshot, f"night-{day.isoformat()}").commit()
    return took


def run_maintenance_bench(settings: Settings, options: MaintenanceBenchOptions) -> dict[str, Any]:
    """The nights in a scratch state dir under the bench folder (removed first)."""
    home = settings.paths.bench_dir / "maintenance-state"
    shutil.rmtree(home, ignore_errors=True)
    warehouse = Warehouse(home / "warehouse")
    starts: list[datetime] = []
    commits: list[float] = []
    maintained: list[TableMaintenance] = []
    maintenance_s: list[float] = []
    for night in range(options.nights):
        starts.append(datetime.now(UTC))
        commits_night = _night(warehouse, night, options)
        commits.append(statistics.median(commits_night))  # robust to a busy machine's spikes
        # The nights are the clock: a snapshot made before the night `retention` nights ago is
        # older than the retention.
        oldest_kept = starts[max(0, night - options.retention_nights + 1)]
        started = time.perf_counter()
        maintained = maintain(
            warehouse, retention=timedelta(0), orphan_age=timedelta(0), now=oldest_kept
        )
        maintenance_s.append(time.perf_counter() - started)
    shutil.rmtree(home, ignore_errors=True)
    steady = min(options.retention_nights, options.nights - 1)
    return {
        **options.model_dump(),
        "commit_s_night1": round(commits[0], 4),
        "commit_s_night30": round(commits[-1], 4),
        "commit_ratio": round(commits[-1] / commits[0], 3),
        # Once the retention is reached the snapshots kept stop growing (but for one tag a
        # night): the last night against the first night that keeps a full retention.
        "commit_s_retention_reached": round(commits[steady], 4),
        "commit_ratio_retention_reached": round(commits[-1] / commits[steady], 3),
        "commit_s_by_night": [round(value, 4) for value in commits],
        "maintenance_s_last": round(maintenance_s[-1], 3),
        "metadata_bytes_max": max(item.metadata_bytes for item in maintained),
        "tables": {item.table: item.model_dump(exclude={"table"}) for item in maintained},
    }


def maintenance_table(document: dict[str, Any]) -> str:
    """The figures as a Markdown table."""
    lines = [
        f"{document['nights']} nights, {document['partitions']} partitions a table a night, "
        f"{document['rows']} rows each, snapshots kept {document['retention_nights']} nights "
        "(and every night's tag)",
        "",
        "| measure | value |",
        "| --- | --- |",
        f"| commit s, night 1 | {document['commit_s_night1']} |",
        f"| commit s, night {document['nights']} | {document['commit_s_night30']} |",
        f"| ratio | {document['commit_ratio']} |",
        f"| commit s, night {document['retention_nights'] + 1} (retention reached) | "
        f"{document['commit_s_retention_reached']} |",
        f"| ratio, last night to it | {document['commit_ratio_retention_reached']} |",
        f"| largest metadata file (bytes) | {document['metadata_bytes_max']} |",
        f"| maintenance s, last night | {document['maintenance_s_last']} |",
    ]
    for table, item in document["tables"].items():
        lines.append(
            f"| {table}: metadata bytes / manifests / snapshots | {item['metadata_bytes']} / "
            f"{item['manifests']} / {item['snapshots_kept']} |"
        )
    return "\n".join(lines) + "\n"


def write_maintenance_outputs(document: dict[str, Any], json_path: Path) -> tuple[Path, Path]:
    """The figures as JSON (`{"maintenance": ...}`) and a Markdown table beside it."""
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps({"maintenance": document}, indent=2, sort_keys=True))
    table_path = json_path.with_suffix(".md")
    table_path.write_text(maintenance_table(document))
    return json_path, table_path
