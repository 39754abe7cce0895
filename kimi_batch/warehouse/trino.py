"""Trino over the warehouse's Iceberg tables: its catalog file, and reading through it.

Trino reads the tables the warehouse commits with its Iceberg connector, from the same catalog:
pyiceberg's SQL catalog in the state database (the ledger's SQLite file, or the PostgreSQL schema
`kimi_ledger`). `catalog_properties` writes that connector's catalog file for this deployment
(`scripts/trino.sh` and `kimi-batch publish` use it); a commit is seen by Trino's next query, so
nothing is ever registered or published. The catalog is read-only in Trino: a write through it
would bypass the partition leases.

`TrinoReader` runs queries (`query`, `count`), each with a deadline; an unreachable coordinator
is a `TrinoUnavailableError`, a refused statement a `TrinoQueryError` and one past its deadline a
`TrinoTimeoutError` (all `StorageError`s). Identifiers are validated (`^[a-z_][a-z0-9_]*$`) and
double-quoted; values go in as query parameters. No caller text is ever formatted into SQL
unchecked.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Sequence
from datetime import date
from pathlib import Path
from typing import Any, Literal, Self
from urllib.parse import quote, urlencode

import requests
import tenacity
import trino.auth
import trino.dbapi
import trino.exceptions
from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from kimi_batch.paths import database_server
from kimi_batch.settings import Settings
from kimi_batch.storage import StorageError, property_value, write_private_text
from kimi_batch.warehouse.schema import (
    CATALOG_NAME,
    LEDGER_SCHEMA,
    quote_identifier,
    validate_ds,
    validate_identifier,
    validate_source,
    validate_table,
)

DEFAULT_PORT = 8080
REQUEST_TIMEOUT_S = 60.0
# One statement, queued and run, all polls included: a query Trino keeps queued must not hang
# its caller (the morning report, a status) for ever.
STATEMENT_TIMEOUT_S = 300.0
# After the deadline, how long the cancelled statement's thread is given to notice.
_CANCEL_GRACE_S = 5.0
MAX_ATTEMPTS = 2
# A statement Trino refuses for want of a node is sent again this often, for this long: the
# coordinator's node manager refreshes every 5 s.
NO_NODES_RETRY_S = 2.0
NO_NODES_WAIT_S = 30.0


class TrinoUnavailableError(StorageError):
    """Trino could not be reached (refused, timed out, HTTP 5xx); the tables are unaffected."""


class TrinoQueryError(StorageError):
    """Trino rejected or failed a statement."""


class TrinoTimeoutError(TrinoQueryError):
    """A statement ran (or stayed queued) past its overall deadline and was cancelled."""


class TrinoConfig(BaseModel):
    """Where Trino is and which catalog/schema hold the output tables."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = Field(min_length=1, description="Trino coordinator host.")
    port: int = Field(default=DEFAULT_PORT, gt=0, lt=65536)
    user: str = Field(default="kimi_batch", min_length=1)
    password: SecretStr | None = Field(default=None, description="Basic auth; needs https.")
    catalog: str = Field(default="iceberg", description="Iceberg-connector catalog.")
    schema_name: str = Field(default="kimi_batch", description="Schema of the output tables.")
    http_scheme: Literal["http", "https"] = "http"
    request_timeout_s: float = Field(
        default=REQUEST_TIMEOUT_S, gt=0, description="One HTTP request to the coordinator."
    )
    statement_timeout_s: float = Field(
        default=STATEMENT_TIMEOUT_S,
        gt=0,
        description="One statement from submission to its last row; then it is cancelled.",
    )
    max_attempts: int = Field(default=MAX_ATTEMPTS, ge=1, le=10)

    @model_validator(mode="after")
    def _password_needs_https(self) -> Self:
        # The client refuses to send basic-auth credentials in clear text; say so up front.
        if self.password is not None and self.http_scheme != "https":
            raise ValueError("a Trino password needs http_scheme='https'")
        return self

    @classmethod
    def from_settings(cls, settings: Settings) -> TrinoConfig:
        """The deployment's Trino; StorageError when KIMI_BATCH_TRINO_HOST is not set."""
        if not settings.trino_host:
            raise StorageError("Trino is not configured (KIMI_BATCH_TRINO_HOST is not set)")
        password = settings.trino_password
        return cls(
            host=settings.trino_host,
            port=settings.trino_port,
            user=settings.trino_user,
            password=SecretStr(password) if password else None,
            # Basic auth is only sent over https (the client refuses clear text).
            http_scheme="https" if password else "http",
            catalog=settings.trino_catalog,
            schema_name=settings.trino_schema,
        )


def catalog_properties(settings: Settings, *, masked: bool = False) -> str:
    """The Iceberg connector's catalog file for this deployment's warehouse (`masked`: with its
    secrets shown as `***`, for a terminal)."""
    secret = {"iceberg.jdbc-catalog.connection-password", "s3.aws-secret-key"}
    lines = [
        f"{key}={'***' if masked and key in secret else property_value(value)}"
        for key, value in catalog_property_map(settings).items()
    ]
    return "\n".join(lines) + "\n"


def catalog_property_map(settings: Settings) -> dict[str, str]:
    """The catalog's properties by name (`connector.name` first): the file's lines, or a
    `CREATE CATALOG` on a Trino that manages its catalogs dynamically."""
    return {
        "connector.name": "iceberg",
        "iceberg.catalog.type": "jdbc",
        "iceberg.jdbc-catalog.catalog-name": CATALOG_NAME,
        **_jdbc_properties(settings),
        "iceberg.jdbc-catalog.default-warehouse-dir": settings.paths.warehouse_root,
        # Trino reads; the warehouse writes, under the partition leases Trino knows nothing of.
        "iceberg.security": "read_only",
        **_file_system_properties(settings),
    }


def write_catalog(settings: Settings, path: Path) -> Path:
    """Write `catalog_properties` to `path` whole, owner-only (it may hold passwords)."""
    return write_private_text(path, catalog_properties(settings))


def _jdbc_properties(settings: Settings) -> dict[str, str]:
    """The catalog database: the ledger's SQLite file, or its PostgreSQL schema."""
    url = settings.paths.ledger_state.url
    if url is None:
        return {
            "iceberg.jdbc-catalog.driver-class": "org.sqlite.JDBC",
            "iceberg.jdbc-catalog.connection-url": f"jdbc:sqlite:{settings.paths.ledger_path}",
        }
    server = database_server(url)
    # libpq's other parameters (sslmode ...) mostly mean the same to the JDBC driver, which
    # percent-decodes the database name and each value.
    params = dict(server.params)
    # libpq connects to `hostaddr` when it is given (`host` then names it for TLS and auth);
    # JDBC has one name for both, so under verify-full (the certificate checked against the
    # host's name) it keeps the name. No host: libpq's local server over its socket, which Java
    # reaches over TCP at localhost.
    address = params.pop("hostaddr", None)
    if params.get("sslmode") == "verify-full" and server.host:
        address = None
    host = address or server.host or "localhost"
    query = {**params, "currentSchema": LEDGER_SCHEMA}
    address = f"[{host}]" if ":" in host else host
    database = quote(server.dbname, safe="")
    properties = {
        "iceberg.jdbc-catalog.driver-class": "org.postgresql.Driver",
        "iceberg.jdbc-catalog.connection-url": f"jdbc:postgresql://{address}:{server.port or 5432}"
        f"/{database}?{urlencode(query)}",
    }
    user = server.user
    password = server.password.get_secret_value() if server.password else None
    if user:
        properties["iceberg.jdbc-catalog.connection-user"] = user
    if password:
        properties["iceberg.jdbc-catalog.connection-password"] = password
    return properties


def _file_system_properties(settings: Settings) -> dict[str, str]:
    """Trino's native file system of the warehouse: the local one rooted at `/` (the tables' file:
    URLs are absolute), or S3 with the warehouse's endpoint and the environment's credentials."""
    if settings.paths.warehouse_url is None:
        return {"fs.native-local.enabled": "true", "local.location": "/"}
    properties = {"fs.native-s3.enabled": "true"}
    if settings.s3_endpoint:
        # Path-style addressing: every S3-compatible server answers it.
        properties |= {"s3.endpoint": settings.s3_endpoint, "s3.path-style-access": "true"}
    properties["s3.region"] = settings.s3_region or os.environ.get("AWS_REGION") or "us-east-1"
    key, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
    if key and secret:  # unset: Trino's default AWS credential chain
        properties |= {"s3.aws-access-key": key, "s3.aws-secret-key": secret}
    return properties


def _cancel(cursor: trino.dbapi.Cursor) -> str:
    """Cancel the cursor's statement (DELETE on its next URI); returns its last known state."""
    stats = getattr(cursor, "stats", None) or {}
    state = str(stats.get("state") or "not started")
    with contextlib.suppress(Exception):  # best effort: the deadline is reported either way
        cursor.cancel()
    # The client's loops (execute's, and fetchall's, which does not look at `cancelled`) poll
    # for as long as the coordinator hands out a nextUri: a queued-forever statement, or one
    # whose DELETE was not taken, would be polled on for ever by the abandoned thread. Marking
    # the query cancelled and finished ends both loops at their next poll; the client has no
    # public way to do it.
    query = getattr(cursor, "_query", None)
    if query is not None:
        query._cancelled = True
        query._finished = True
    return state


def _no_nodes_available(error: BaseException) -> bool:
    """Trino refused to schedule the statement because it counts no worker for the catalog.

    The coordinator's node manager leaves out, until its next refresh, a node it does not count
    as up (one whose heartbeats its failure detector missed on a loaded machine, say): for those
    seconds a scan is refused NO_NODES_AVAILABLE. Nothing ran, so sending the read again is
    safe; Trino's client retries only HTTP-level failures.
    """
    cause = error.__cause__
    return (
        isinstance(error, TrinoQueryError)
        and isinstance(cause, trino.exceptions.TrinoQueryError)
        and cause.error_name == "NO_NODES_AVAILABLE"
    )


class TrinoReader:
    """Queries the warehouse's tables through Trino (a connection opened on first use)."""

    def __init__(self, config: TrinoConfig) -> None:
        self.config = config
        self.catalog = validate_identifier(config.catalog, what="catalog")
        self.schema = validate_identifier(config.schema_name, what="schema")
        self._connection: trino.dbapi.Connection | None = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _connect(self) -> trino.dbapi.Connection:
        if self._connection is None:
            config = self.config
            auth = (
                trino.auth.BasicAuthentication(config.user, config.password.get_secret_value())
                if config.password is not None
                else None
            )
            self._connection = trino.dbapi.connect(
                host=config.host,
                port=config.port,
                user=config.user,
                catalog=self.catalog,
                schema=self.schema,
                http_scheme=config.http_scheme,
                auth=auth,
                source="kimi_batch",
                request_timeout=config.request_timeout_s,
                max_attempts=config.max_attempts,
            )
        return self._connection

    def query(self, sql: str, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
        """Run one statement (`?` placeholders for `params`) and return its rows as tuples.

        The client polls a queued or running statement for as long as the coordinator says
        so; here the whole statement has `statement_timeout_s`, after which it is cancelled and
        TrinoTimeoutError says how far it got. A statement refused for want of a node is sent
        again for up to `NO_NODES_WAIT_S` (see `_no_nodes_available`).
        """
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_delay(NO_NODES_WAIT_S),
            wait=tenacity.wait_fixed(NO_NODES_RETRY_S),
            retry=tenacity.retry_if_exception(_no_nodes_available),
            reraise=True,
        )
        return retrying(self._statement, sql, params)

    def _statement(self, sql: str, params: Sequence[Any] | None) -> list[tuple[Any, ...]]:
        where = f"{self.config.host}:{self.config.port}"
        cursor = self._cursor(where)
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                outcome["rows"] = self._execute(cursor, sql, params, where)
            except BaseException as error:  # handed to the calling thread
                outcome["error"] = error

        worker = threading.Thread(target=run, name="trino-statement", daemon=True)
        worker.start()
        worker.join(self.config.statement_timeout_s)
        if worker.is_alive():
            state = _cancel(cursor)
            worker.join(_CANCEL_GRACE_S)
            self.close()  # the connection may still be in the abandoned thread's hands
            raise TrinoTimeoutError(
                f"Trino at {where} did not finish a statement within "
                f"{self.config.statement_timeout_s:g} s (last state {state}); it was cancelled: "
                f"{' '.join(sql.split())[:120]}"
            )
        if "error" in outcome:
            raise outcome["error"]
        return outcome["rows"]

    def _cursor(self, where: str) -> trino.dbapi.Cursor:
        try:
            return self._connect().cursor()
        except (trino.exceptions.TrinoConnectionError, OSError) as error:
            raise TrinoUnavailableError(f"Trino at {where} is unreachable: {error}") from error

    @staticmethod
    def _execute(
        cursor: trino.dbapi.Cursor, sql: str, params: Sequence[Any] | None, where: str
    ) -> list[tuple[Any, ...]]:
        try:
            if params:
                cursor.execute(sql, list(params))
            else:
                cursor.execute(sql)
            return [tuple(row) for row in cursor.fetchall()]
        except (
            trino.exceptions.TrinoConnectionError,
            trino.exceptions.HttpError,
            requests.exceptions.RequestException,
            OSError,
        ) as error:
            raise TrinoUnavailableError(f"Trino at {where} is unreachable: {error}") from error
        except trino.exceptions.TrinoQueryError as error:
            raise TrinoQueryError(f"{error.error_name}: {error.message}") from error
        except trino.exceptions.Error as error:
            raise TrinoQueryError(f"Trino at {where} failed: {error}") from error

    def table_ref(self, table: str) -> str:
        """The table's quoted catalog.schema.table name."""
        validate_table(table)
        return (
            f"{quote_identifier(self.catalog)}.{quote_identifier(self.schema)}."
            f"{quote_identifier(table)}"
        )

    def count(self, table: str, ds: str | date | None = None, source: str | None = None) -> int:
        """Rows of a table as Trino sees them, optionally of one ds and/or source."""
        validate_table(table)
        conditions: list[str] = []
        params: list[str] = []
        if ds is not None:
            conditions.append('"ds" = ?')
            params.append(validate_ds(ds))
        if source is not None:
            conditions.append('"source" = ?')
            params.append(validate_source(source))
        where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
        ((value,),) = self.query(f"SELECT count(*) FROM {self.table_ref(table)}{where}", params)
        return int(value)
