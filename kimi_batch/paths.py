"""Where every state file lives: the one owner of the `$KIMI_BATCH_HOME` layout.

    home/
      server/            pid, spec, log and exit record of the resident llama-server;
                         speeds.json: the prompt/decode speeds last measured, per model
      smoke/             log of the last `kimi-batch server smoke` (the end of `make setup`)
      slots/             slot saves of the system digest (--slot-save-path); a batch's own
                         saves of shared system prompts (prompt-*), removed when it ends
      ledger/            ledger.sqlite3: finished requests and partition leases
      landed/            content-addressed snapshots of ingested inputs + manifest.sqlite3
      inbox/             where users drop input files (the sensor watches it)
      warehouse/         the Iceberg tables' data and metadata files (unless KIMI_BATCH_WAREHOUSE
                         names an object store); their SQL catalog is in the ledger's database
      dagster/           DAGSTER_HOME of the demo and `make dev`
      bench/             `kimi-batch bench`: bench.json/.md/.png, speeds.json, state/ of its server
      tune/              `kimi-batch tune`: tune.json/.md/.png, speeds.json
      quality/           dedup.sqlite3: every kept answer's exact key and MinHash (the duplicate
                         index of the quality gate, across nights and workers)
      api/               `kimi-batch api`: files/<sha256> (uploads and output files), api.sqlite3,
                         key (the generated bearer key, 0600)
      exports/           `kimi-batch export` without --out
      partitions_start   the first date partition of this install (written once)

With `KIMI_BATCH_DATABASE_URL` set, the four databases (ledger, manifest, API store, duplicate
index) are schemas of that PostgreSQL database instead of the SQLite files (`StateLocation`);
the files stay where `kimi-batch state migrate` reads them.

Nothing else builds these paths. Directories holding generated text or inputs are created 0700:
prompts and answers can be confidential, and the box is shared with Dagster and Trino users.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable, Iterator
from datetime import date
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from kimi_batch.errors import ConfigError
from kimi_batch.redaction import masked_message, masked_url, readers_disagree

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


def connect_private_db(path: Path, *, timeout_s: float = 60.0) -> sqlite3.Connection:
    """A state database (ledger, manifest, API store): owner-only, WAL, durable commits."""
    db = sqlite3.connect(path, isolation_level=None, timeout=timeout_s, check_same_thread=False)
    # SQLite gives the -wal and -shm files the database file's mode.
    os.chmod(path, PRIVATE_FILE_MODE)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    return db


def private_dir(path: Path) -> Path:
    """Create `path` (and parents) and make the leaf owner-only; returns it."""
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, PRIVATE_DIR_MODE)
    return path


def _masked_args(
    args: Iterable[tuple[str | None, Any]], field: str
) -> Iterator[tuple[str | None, Any]]:
    for name, value in args:
        yield name, masked_url(value) if name == field and isinstance(value, str) else value


class DatabaseServer(BaseModel):
    """The PostgreSQL server and database a `postgresql://` URL names, as libpq reads it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str | None = Field(description="None: libpq's default, the local server.")
    port: int | None
    dbname: str
    user: str | None
    password: SecretStr | None
    # repr=False: `sslpassword` may be among them.
    params: dict[str, str] = Field(
        repr=False, description="libpq's other parameters (sslmode, options ...)."
    )


def database_server(url: str) -> DatabaseServer:
    """`url` read by libpq's rules (psycopg's `conninfo_to_dict`: percent-decoding, and a
    `?host=`, `?port=`, `?user=` ... in the query standing for the URL's own), the way the state
    databases connect with it; a ValueError that never repeats the URL (it may hold a password)
    when it names no database, several hosts or a socket folder: the Iceberg catalog (SQLAlchemy)
    and Trino's (JDBC, over TCP) take one server by host name."""
    # Imported here: only a deployment with a database URL needs psycopg.
    from psycopg import ProgrammingError
    from psycopg.conninfo import conninfo_to_dict

    if readers_disagree(url):
        raise ValueError(
            "its user name or password holds an '@', '/', '?' or '#' that is not "
            "percent-encoded (%40, %2F, %3F, %23): libpq and other readers end it elsewhere"
        )
    try:
        fields = {name: str(value) for name, value in conninfo_to_dict(url).items()}
    except ProgrammingError as error:  # libpq's reason may quote the password: masked
        reason = masked_message(str(error).strip(), url)
        raise ValueError(f"is not a URL libpq can read: {reason}") from None
    host, port = fields.pop("host", None) or None, fields.pop("port", None) or None
    dbname = fields.pop("dbname", None)
    if not dbname:
        raise ValueError("must name a database (postgresql://host/DATABASE)")
    if "service" in fields:
        raise ValueError(
            "names a pg_service.conf entry (service=), which Trino's JDBC driver cannot read: "
            "give the host, port and database in the URL"
        )
    if "," in fields.get("hostaddr", "") or (
        host is not None and ("," in host or (port is not None and "," in port))
    ):
        raise ValueError("names several hosts: give the one server to use (its host name)")
    if host is not None and host.startswith(("/", "@")):
        raise ValueError(
            "names a socket folder: Trino reads the catalog over TCP, give the server's host "
            "name (postgresql://localhost:5432/db)"
        )
    if port is not None and not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        raise ValueError("has a port that is not a number from 1 to 65535")
    password = fields.pop("password", None)
    return DatabaseServer(
        host=host,
        port=int(port) if port is not None else None,
        dbname=dbname,
        user=fields.pop("user", None),
        password=SecretStr(password) if password is not None else None,
        params=fields,
    )


class StateLocation(BaseModel):
    """Where one store's tables live: its SQLite file (the embedded default), or its schema in
    the PostgreSQL database `url` names."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: Path = Field(description="The SQLite file: the store itself when `url` is None.")
    schema_name: str = Field(pattern=r"^[a-z_][a-z0-9_]*$")
    url: str | None = Field(default=None, description="postgresql://...; None: the SQLite file.")

    @property
    def embedded(self) -> bool:
        return self.url is None

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        """repr and str show the URL's password masked (a log line, a test's traceback)."""
        return _masked_args(super().__repr_args__(), "url")


class StatePaths(BaseModel):
    """The state directory layout (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    home: Path
    warehouse_override: Path | None = None
    warehouse_url: str | None = Field(
        default=None, description="An object-store warehouse (s3://...): replaces the folder."
    )
    database_url: str | None = None

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        return _masked_args(super().__repr_args__(), "database_url")

    @property
    def server_dir(self) -> Path:
        return self.home / "server"

    @property
    def measured_speeds_path(self) -> Path:
        return self.server_dir / "speeds.json"

    @property
    def smoke_dir(self) -> Path:
        return self.home / "smoke"

    @property
    def slot_save_dir(self) -> Path:
        return self.home / "slots"

    @property
    def ledger_dir(self) -> Path:
        return self.home / "ledger"

    @property
    def ledger_path(self) -> Path:
        return self.ledger_dir / "ledger.sqlite3"

    @property
    def ledger_state(self) -> StateLocation:
        return StateLocation(
            path=self.ledger_path, schema_name="kimi_ledger", url=self.database_url
        )

    @property
    def landed_dir(self) -> Path:
        return self.home / "landed"

    @property
    def manifest_path(self) -> Path:
        return self.landed_dir / "manifest.sqlite3"

    @property
    def manifest_state(self) -> StateLocation:
        return StateLocation(
            path=self.manifest_path, schema_name="kimi_landing", url=self.database_url
        )

    @property
    def inbox_dir(self) -> Path:
        return self.home / "inbox"

    @property
    def warehouse_dir(self) -> Path:
        """The warehouse folder; with an object-store warehouse, its local staging folder."""
        return self.warehouse_override or self.home / "warehouse"

    @property
    def warehouse_location(self) -> str:
        """The warehouse as a user names it: its URL, or its folder."""
        return self.warehouse_url or str(self.warehouse_dir)

    @property
    def warehouse_root(self) -> str:
        """The root of the table files as Iceberg locations name it (the catalog's and Trino's):
        the object-store URL, or `file://` and the folder's absolute path as written. Not
        percent-encoded: pyiceberg and Trino take a file URL's path as written, so a space
        encoded `%20` put the tables in another folder (`state%20home`, beside the state
        folder). A '#' or '?' would end the path for both: such a folder is refused."""
        if self.warehouse_url is not None:
            return self.warehouse_url
        folder = str(self.warehouse_dir.expanduser().resolve())
        if "#" in folder or "?" in folder:
            raise ConfigError(
                f"the warehouse folder {folder} holds a '#' or '?', which ends a table file's "
                "location there: use a state folder (KIMI_BATCH_HOME) or KIMI_BATCH_WAREHOUSE "
                "without them"
            )
        return f"file://{folder}"

    @property
    def dagster_home(self) -> Path:
        return self.home / "dagster"

    @property
    def bench_dir(self) -> Path:
        return self.home / "bench"

    @property
    def tune_dir(self) -> Path:
        return self.home / "tune"

    @property
    def exports_dir(self) -> Path:
        """Where `kimi-batch export` writes when no `--out` is given."""
        return self.home / "exports"

    @property
    def api_dir(self) -> Path:
        return self.home / "api"

    @property
    def api_files_dir(self) -> Path:
        return self.api_dir / "files"

    @property
    def api_db_path(self) -> Path:
        return self.api_dir / "api.sqlite3"

    @property
    def api_state(self) -> StateLocation:
        return StateLocation(path=self.api_db_path, schema_name="kimi_api", url=self.database_url)

    @property
    def dedup_index_path(self) -> Path:
        return self.home / "quality" / "dedup.sqlite3"

    @property
    def dedup_state(self) -> StateLocation:
        return StateLocation(
            path=self.dedup_index_path, schema_name="kimi_quality", url=self.database_url
        )

    @property
    def api_key_path(self) -> Path:
        return self.api_dir / "key"

    @property
    def partitions_start_file(self) -> Path:
        return self.home / "partitions_start"

    def install_date(self, today: date) -> date:
        """The first partition date of this install: written on first use, then fixed.

        A fixed date (not "today minus N") keeps every partition ever created inside the
        partitions definition, and a new install shows no year of empty partitions. An empty or
        garbled file is refused (ConfigError), never reset to today: older partitions would
        fall outside the date range. The first writer wins, atomically (no reader sees it empty).
        """
        path = self.partitions_start_file
        try:
            return _read_start(path)
        except FileNotFoundError:
            pass
        try:
            self.home.mkdir(parents=True, exist_ok=True)
            temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            temp.write_text(today.isoformat() + "\n")
            try:
                os.link(temp, path)
            except FileExistsError:
                return _read_start(path)
            finally:
                temp.unlink(missing_ok=True)
        except OSError:
            pass  # a read-only home still gets a start date, just not a persisted one
        return today


def _read_start(path: Path) -> date:
    """The date `path` holds; FileNotFoundError when there is none, ConfigError for anything
    else that is not one (garbled text, bytes that are not text, a folder)."""
    fix = "restore it, or set KIMI_BATCH_PARTITIONS_START"
    try:
        text = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        raise
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) else "not UTF-8 text"
        raise ConfigError(
            f"{path} cannot be read as the install's first partition date ({reason}): {fix}"
        ) from None
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise ConfigError(
            f"{path} holds {text[:40]!r}, not the install's first partition date (YYYY-MM-DD): "
            f"{fix}"
        ) from None
