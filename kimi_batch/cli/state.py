"""`kimi-batch state migrate`: a box's SQLite state copied into PostgreSQL.

The ledger (finished requests and the Iceberg catalog), the landing manifest (every file's
partition and its landed versions) and the Batch API store (files and batches) move as they
are, so a team that outgrows one box keeps every row it generated: a rerun on PostgreSQL finds
them all and sends nothing. A table holding rows that the target has no place for (an older
version's object-store version pointers: `kimi-batch warehouse migrate` first) is refused by
name before anything is copied, never left behind.
Partition leases are left behind (a lease is held by a running process; none runs across a
move), and so is the duplicate index: the quality gate rebuilds it from the warehouse the first
time it screens a partition on PostgreSQL. The landed snapshots and the Batch API's files go into
the database too (each store's blobs, `storage.blobs`), so a run on any host reads them; the
warehouse stays where it is (`KIMI_BATCH_WAREHOUSE` names where it is read from). A second run
copies no row twice and puts in only the files the database lacks.

The target's URL is read from KIMI_BATCH_DATABASE_URL (what every machine sets afterwards), from
another variable (`--to-env VAR`) or a file (`--to-file PATH`, `-` for stdin), never needed on
the command line: argv is readable by every user of the machine (`ps`, /proc/PID/cmdline). `--to
URL` still takes a URL without a password (libpq then reads ~/.pgpass or PGPASSWORD); one with a
password there is refused before anything connects. Every URL shown has its password masked.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from kimi_batch.crash_points import crash_point
from kimi_batch.redaction import url_secrets
from kimi_batch.settings import ConfigError, Settings, StateSettings
from kimi_batch.state import StoreCopy, connect_state, copy_store, shown_url


def migrate_state(settings: Settings, url: str) -> list[StoreCopy]:
    """Copy the ledger, the manifest and the API store of `settings`' state dir to `url`."""
    # Imported when run: the CLI's other commands start without the storage layer.
    from kimi_batch.batch_api import ApiStore
    from kimi_batch.engine import Ledger
    from kimi_batch.inputs import Landing
    from kimi_batch.warehouse import CatalogSpec, open_catalog

    try:
        StateSettings(database_url=url)
    except ValidationError as error:
        reason = error.errors()[0]["msg"].removeprefix("Value error, ")
        raise ConfigError(f"state migrate --to {shown_url(url)}: {reason}") from None
    source = settings.paths
    target = source.model_copy(update={"database_url": url})
    # Each store creates its own tables in the target first.
    Ledger(target.ledger_state).close()
    # The tables' catalog lives in the ledger's database: its tables are created, then copied.
    open_catalog(CatalogSpec.from_settings(settings.model_copy(update={"database_url": url})))
    Landing(target).close()
    ApiStore(target).close()
    copies = []
    for store, path, location, leave_out in (
        ("ledger", source.ledger_path, target.ledger_state, ("leases",)),
        ("manifest", source.manifest_path, target.manifest_state, ()),
        ("api", source.api_db_path, target.api_state, ()),
    ):
        with connect_state(location) as db:
            copies.append(copy_store(store, path, db, leave_out=leave_out))
    # The files their rows name, after the rows: each store shares only what it lacks.
    with Landing(target) as landing:
        landed = landing.share_all()
    with ApiStore(target) as api:
        uploaded = api.share_all()
    crash_point("state.files_shared")
    for index, shared in ((1, landed), (2, uploaded)):
        copies[index] = copies[index].model_copy(
            update={"files": shared.shared, "missing_files": shared.missing}
        )
    return copies


def _target_url(args: argparse.Namespace, settings: Settings) -> str:
    """The database `state migrate` copies into: `--to`, `--to-env`, `--to-file`, else
    KIMI_BATCH_DATABASE_URL; ConfigError for a password on the command line or no URL at all."""
    if args.to is not None:
        if url_secrets(args.to):
            raise ConfigError(
                f"state migrate --to {shown_url(args.to)}: a password on the command line is "
                "visible to every user of this machine (ps, /proc/PID/cmdline); set "
                "KIMI_BATCH_DATABASE_URL, or use --to-env VAR or --to-file PATH (- for stdin), "
                "or keep the password in ~/.pgpass or PGPASSWORD"
            )
        return args.to
    if args.to_env is not None:
        url = os.environ.get(args.to_env, "").strip()
        if not url:
            raise ConfigError(f"state migrate --to-env {args.to_env}: that variable is not set")
        return url
    if args.to_file is not None:
        return _url_from_file(args.to_file)
    if settings.database_url is None:
        raise ConfigError(
            "state migrate: no target database; set KIMI_BATCH_DATABASE_URL to its "
            "postgresql:// URL (or use --to-env VAR or --to-file PATH, - for stdin)"
        )
    return settings.database_url


def _url_from_file(name: str) -> str:
    try:
        text = sys.stdin.read() if name == "-" else Path(name).read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"state migrate --to-file {name}: cannot read it ({error})") from None
    url = text.strip()
    if not url:
        raise ConfigError(f"state migrate --to-file {name}: it holds no URL")
    return url


def _migrate(args: argparse.Namespace, settings: Settings) -> int:
    url = _target_url(args, settings)
    copies = migrate_state(settings, url)
    report: dict[str, Any] = {
        "to": shown_url(url),
        "stores": [copy.model_dump() for copy in copies],
    }
    print(json.dumps(report))
    return 0


def add_state_commands(commands: argparse._SubParsersAction[Any]) -> None:
    state = commands.add_parser(
        "state",
        help="move the pipeline's state (finished rows, landed inputs, batches) to PostgreSQL",
        description="The state this box keeps in SQLite files under the state directory: "
        "finished requests, which partition each input file belongs to, Batch API files and "
        "batches.",
    ).add_subparsers(dest="action", required=True, title="commands", metavar="COMMAND")
    migrate = state.add_parser(
        "migrate",
        help="copy this box's state into a PostgreSQL database",
        description="Copy this box's finished requests, landed inputs' partitions and Batch "
        "API batches into the PostgreSQL database KIMI_BATCH_DATABASE_URL names (set it to "
        "postgresql://user:password@host:5432/db, as on every machine afterwards): nothing "
        "already generated is generated again. A database that already holds them is left as "
        "it is; prints what was copied as JSON (the password masked).",
    )
    target = migrate.add_mutually_exclusive_group()
    target.add_argument(
        "--to-env",
        metavar="VAR",
        help="read the URL from this environment variable instead of KIMI_BATCH_DATABASE_URL",
    )
    target.add_argument(
        "--to-file", metavar="PATH", help="read the URL from this file (- reads stdin)"
    )
    target.add_argument(
        "--to",
        metavar="URL",
        help="the URL itself, without a password (argv is visible to every user: a URL with "
        "a password is refused; libpq reads the password from ~/.pgpass or PGPASSWORD)",
    )
    migrate.set_defaults(func=_migrate)
