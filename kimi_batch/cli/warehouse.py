"""`kimi-batch warehouse maintain|migrate`: the tables' upkeep, and a Hive-layout warehouse moved in.

`maintain` is what the maintenance schedule runs (`kimi_batch.defs.maintenance`), by hand.
`migrate` is its own command rather than part of `state migrate`: that one moves the state
databases to PostgreSQL and leaves the warehouse where it is; this one turns the files of a
warehouse written before the Iceberg tables into them, in place, on either state.
"""

from __future__ import annotations

import argparse
import json
from datetime import timedelta
from typing import Any

from kimi_batch.settings import Settings


def _days(value: str) -> int:
    # At least a day, as KIMI_BATCH_SNAPSHOT_RETENTION_DAYS: 0 or less would expire every
    # snapshot but the current one, and with it every moment `export --as-of` could read.
    if not (value.isascii() and value.isdigit()) or int(value) < 1:
        raise argparse.ArgumentTypeError(f"a retention is 1 day or more, not {value!r}")
    return int(value)


def _maintain(args: argparse.Namespace, settings: Settings) -> int:
    from kimi_batch.warehouse import maintain, open_warehouse

    days = settings.snapshot_retention_days if args.retention_days is None else args.retention_days
    reports = maintain(open_warehouse(settings), retention=timedelta(days=days))
    print(json.dumps({"retention_days": days, "tables": [r.model_dump() for r in reports]}))
    return 0


def _storage_options(settings: Settings) -> dict[str, str] | None:
    """What polars needs to read an object store's old files (credentials: AWS variables)."""
    if not (settings.paths.warehouse_url or "").startswith("s3://"):
        return None
    options = {"aws_region": settings.s3_region or "us-east-1"}
    if settings.s3_endpoint:
        options["aws_endpoint_url"] = settings.s3_endpoint
        options["aws_allow_http"] = str(settings.s3_endpoint.startswith("http://")).lower()
    return options


def _migrate(args: argparse.Namespace, settings: Settings) -> int:
    from kimi_batch.warehouse import hive_partitions, migrate, open_warehouse

    paths = settings.paths
    root = args.source or paths.warehouse_url or paths.warehouse_dir
    found = hive_partitions(root, paths.ledger_state)
    done = migrate(
        open_warehouse(settings),
        found,
        replace=args.replace,
        storage_options=_storage_options(settings),
    )
    counts: dict[str, Any] = {}
    for item in done:
        counts[item.action] = counts.get(item.action, 0) + 1
    report = {
        "from": str(root),
        "partitions": counts,
        "rows": sum(item.rows_table for item in done if item.action == "copied"),
        "checked": [item.model_dump() for item in done],
    }
    print(json.dumps(report))
    return 0


def add_warehouse_commands(commands: argparse._SubParsersAction[Any]) -> None:
    warehouse = commands.add_parser(
        "warehouse",
        help="maintain the output tables, or move an older warehouse into them",
        description="The output tables (Apache Iceberg, in the state database's catalog).",
    ).add_subparsers(dest="action", required=True, title="commands", metavar="COMMAND")
    maintain = warehouse.add_parser(
        "maintain",
        help="expire old snapshots and remove unreferenced files (what the schedule runs)",
        description="Expire every table's snapshots older than the retention (tagged snapshots "
        "and the current one stay), then remove the files no snapshot names that are over a "
        "day old. Prints what each table kept and removed as JSON.",
    )
    maintain.add_argument(
        "--retention-days",
        type=_days,
        default=None,
        metavar="DAYS",
        help="keep snapshots this many days (default: KIMI_BATCH_SNAPSHOT_RETENTION_DAYS)",
    )
    maintain.set_defaults(func=_maintain)
    migrate = warehouse.add_parser(
        "migrate",
        help="copy a warehouse of Parquet files in the older folder layout into the tables",
        description="Copy each partition's current file of a warehouse written before the "
        "Iceberg tables (<table>/ds=D/source=S/part-0.parquet; on an object store, the "
        "version the ledger names) into its table, one commit a partition, and check the row "
        "counts. No row is generated again; partitions the tables already hold are left as "
        "they are (--replace overwrites them); the old files are left in place. Prints the "
        "counts as JSON.",
    )
    migrate.add_argument(
        "--from",
        dest="source",
        default=None,
        metavar="FOLDER|URL",
        help="the old warehouse (default: KIMI_BATCH_WAREHOUSE, the tables' own root)",
    )
    migrate.add_argument(
        "--replace", action="store_true", help="overwrite partitions the tables already hold"
    )
    migrate.set_defaults(func=_migrate)
