"""Publish warehouse partitions as Trino tables (Hive connector).

Trino reads the Parquet files in place: each output table is an external, partitioned table whose
location is the table's directory as Trino sees it (`TrinoConfig.warehouse_location` + table; the
local catalog of `scripts/trino.sh` is rooted at the warehouse, so that is `local:///<table>`; an
s3:// warehouse is its own URL), and each partition written by `Warehouse` is added with
`system.register_partition`. An object-store warehouse writes each version of a partition under
a prefix of its own: the partition is registered at its current version's prefix, and registered
again (unregistered first) after each replace.

Identifiers are validated (`^[a-z_][a-z0-9_]*$`) and double-quoted; values go in as query
parameters, or, where Trino takes none (CALL), as escaped string literals of already validated
values. No caller text is ever formatted into SQL unchecked.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date
from typing import TYPE_CHECKING, Any, Literal, Self

import requests
import trino.auth
import trino.dbapi
import trino.exceptions
from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from kimi_batch.settings import Settings
from kimi_batch.storage.exceptions import (
    SchemaMismatchError,
    StorageError,
    TrinoQueryError,
    TrinoTimeoutError,
    TrinoUnavailableError,
)
from kimi_batch.storage.schema import validate_ds, validate_source

if TYPE_CHECKING:
    from kimi_batch.warehouse import Warehouse
from kimi_batch.storage.schema import (
    PARTITION_COLUMNS,
    TABLES,
    quote_identifier,
    trino_columns,
    validate_identifier,
    validate_table,
)

__all__ = ["PublishReport", "TrinoConfig", "TrinoPublisher"]

DEFAULT_PORT = 8080
REQUEST_TIMEOUT_S = 60.0
# One statement, queued and run, all polls included. Publishing runs inside the partition lease,
# and the llama pool admits one run: a query Trino keeps queued must not hold every later run.
STATEMENT_TIMEOUT_S = 300.0
# After the deadline, how long the cancelled statement's thread is given to notice.
_CANCEL_GRACE_S = 5.0
MAX_ATTEMPTS = 2


class TrinoConfig(BaseModel):
    """Where Trino is and which catalog/schema hold the output tables."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = Field(min_length=1, description="Trino coordinator host.")
    port: int = Field(default=DEFAULT_PORT, gt=0, lt=65536)
    user: str = Field(default="kimi_batch", min_length=1)
    password: SecretStr | None = Field(default=None, description="Basic auth; needs https.")
    catalog: str = Field(default="hive", description="Hive-connector catalog.")
    schema_name: str = Field(default="kimi_batch", description="Schema of the output tables.")
    http_scheme: Literal["http", "https"] = "http"
    warehouse_location: str = Field(
        default="local:///",
        description="The warehouse root as Trino's file system names it (local:///, s3://b/w/ ...).",
    )
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

    def table_location(self, table: str) -> str:
        base = self.warehouse_location
        return f"{base}{table}" if base.endswith("/") else f"{base}/{table}"

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
            warehouse_location=_warehouse_location(settings),
        )


def _warehouse_location(settings: Settings) -> str:
    """KIMI_BATCH_TRINO_WAREHOUSE_LOCATION; unset with an s3:// warehouse, its URL (the S3
    catalog of `scripts/trino.sh` names objects as the warehouse does)."""
    default = TrinoConfig.model_fields["warehouse_location"].default
    url = settings.paths.warehouse_url
    if url is not None and settings.trino_warehouse_location == default:
        return f"{url}/"
    return settings.trino_warehouse_location


@dataclass(frozen=True, kw_only=True)
class PublishReport:
    """What one publish call did."""

    tables: tuple[str, ...]
    partitions_registered: int
    partitions_present: int


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


def _literal(value: str) -> str:
    """A SQL string literal; only for values already validated by a strict pattern."""
    return "'" + value.replace("'", "''") + "'"


class TrinoPublisher:
    """Creates the schema and tables in Trino and registers warehouse partitions."""

    def __init__(self, config: TrinoConfig) -> None:
        self.config = config
        self.catalog = validate_identifier(config.catalog, what="catalog")
        self.schema = validate_identifier(config.schema_name, what="schema")
        self._connection: trino.dbapi.Connection | None = None
        self._ensured: set[str] = set()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    # -- SQL plumbing ---------------------------------------------------------------------------

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
        TrinoTimeoutError says how far it got.
        """
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

    def _table_ref(self, table: str, *, partitions: bool = False) -> str:
        name = quote_identifier(table)
        if partitions:  # the Hive connector's hidden table "<table>$partitions"
            name = f'"{table}$partitions"'
        return f"{quote_identifier(self.catalog)}.{quote_identifier(self.schema)}.{name}"

    # -- DDL ------------------------------------------------------------------------------------

    def ensure_schema(self, location: str | None = None) -> None:
        """CREATE SCHEMA IF NOT EXISTS (tables carry their own locations, so none is needed)."""
        sql = f"CREATE SCHEMA IF NOT EXISTS {quote_identifier(self.catalog)}.{quote_identifier(self.schema)}"
        if location is None:
            self.query(sql)
        else:
            self.query(f"{sql} WITH (location = ?)", [location])

    def ensure_table(self, table: str, location: str | None = None) -> None:
        """CREATE TABLE IF NOT EXISTS as an external Parquet table partitioned by (ds, source)."""
        validate_table(table)
        columns = ", ".join(
            f"{quote_identifier(name)} {kind}" for name, kind in trino_columns(table)
        )
        partitioned_by = ", ".join(_literal(name) for name in PARTITION_COLUMNS)
        self.query(
            f"CREATE TABLE IF NOT EXISTS {self._table_ref(table)} ({columns}) "
            f"WITH (external_location = ?, format = 'PARQUET', partitioned_by = ARRAY[{partitioned_by}])",
            [location or self.config.table_location(table)],
        )
        self._check_columns(table)

    def _check_columns(self, table: str) -> None:
        found = [
            str(name)
            for (name,) in self.query(
                f"SELECT column_name FROM {quote_identifier(self.catalog)}.information_schema.columns "
                "WHERE table_schema = ? AND table_name = ? ORDER BY ordinal_position",
                [self.schema, table],
            )
        ]
        expected = [name for name, _ in trino_columns(table)]
        if found != expected:
            raise SchemaMismatchError(
                f"{self.catalog}.{self.schema}.{table} has columns {found}, the row model has "
                f"{expected}; drop the Trino table (the Parquet files stay) and publish again"
            )

    def _ensure(self, table: str) -> None:
        if table not in self._ensured:
            self.ensure_schema()
            self.ensure_table(table)
            self._ensured.add(table)

    # -- partitions -----------------------------------------------------------------------------

    def registered_partitions(self, table: str) -> list[tuple[str, str]]:
        """(ds, source) of the partitions the metastore knows, sorted."""
        validate_table(table)
        rows = self.query(
            f'SELECT "ds", "source" FROM {self._table_ref(table, partitions=True)} ORDER BY 1, 2'
        )
        return [(str(ds), str(source)) for ds, source in rows]

    def register_partition(
        self, table: str, ds: str | date, source: str, location: str | None = None
    ) -> bool:
        """Add one partition to the metastore; False if it was already there (idempotent).

        `location` (a version prefix of an object-store warehouse) replaces the registration
        of a partition already there, whose files were at the previous version's prefix."""
        validate_table(table)
        ds, source = validate_ds(ds), validate_source(source)
        present = self.query(
            f'SELECT 1 FROM {self._table_ref(table, partitions=True)} WHERE "ds" = ? AND "source" = ?',
            [ds, source],
        )
        if present and location is None:
            return False
        if present:
            self._call_partition("unregister_partition", table, ds, source)
        try:
            self._call_partition("register_partition", table, ds, source, location)
        except TrinoQueryError as error:
            # Another publisher registered it between our check and the CALL.
            if "ALREADY_EXISTS" in str(error):
                return False
            raise
        return True

    def _call_partition(
        self,
        procedure: Literal["register_partition", "unregister_partition"],
        table: str,
        ds: str,
        source: str,
        location: str | None = None,
    ) -> None:
        # CALL takes no parameters: every name and value below is validated against a strict
        # pattern, but the location (the deployment's warehouse URL plus a version prefix),
        # which goes in as an escaped literal.
        columns = ", ".join(_literal(name) for name in PARTITION_COLUMNS)
        at = "" if location is None else f", location => {_literal(location)}"
        self.query(
            f"CALL {quote_identifier(self.catalog)}.system.{procedure}("
            f"schema_name => {_literal(self.schema)}, table_name => {_literal(table)}, "
            f"partition_columns => ARRAY[{columns}], "
            f"partition_values => ARRAY[{_literal(ds)}, {_literal(source)}]{at})"
        )

    def flush_cache(self, table: str) -> None:
        """Drop Trino's cached metadata/listings of a table (a no-op when caching is off)."""
        validate_table(table)
        self.query(
            f"CALL {quote_identifier(self.catalog)}.system.flush_metadata_cache("
            f"schema_name => {_literal(self.schema)}, table_name => {_literal(table)})"
        )

    def publish_partition(
        self, warehouse: Warehouse, table: str, ds: str | date, source: str
    ) -> PublishReport:
        """Make one written partition queryable: schema, table, partition, fresh metadata."""
        ds, source = validate_ds(ds), validate_source(source)
        if not warehouse.has_partition(table, ds, source):
            raise StorageError(f"nothing to publish: {table} ds={ds} source={source} not written")
        self._ensure(table)
        location = warehouse.partition_location(table, ds, source)
        registered = self.register_partition(table, ds, source, location)
        # A re-written partition keeps its registration; a caching catalog must still re-list it.
        self.flush_cache(table)
        return PublishReport(
            tables=(table,), partitions_registered=int(registered), partitions_present=1
        )

    def publish_all(self, warehouse: Warehouse) -> PublishReport:
        """Catch up: create every table and register every partition present on disk."""
        registered = present = 0
        for table in TABLES:
            self._ensure(table)
            known = set(self.registered_partitions(table))
            on_disk = warehouse.partitions(table)
            for ds, source in on_disk:
                location = warehouse.partition_location(table, ds, source)
                # A version prefix may have changed while Trino was away: registered again.
                if (ds, source) not in known or location is not None:
                    registered += int(self.register_partition(table, ds, source, location))
            present += len(on_disk)
            self.flush_cache(table)
        return PublishReport(
            tables=tuple(TABLES), partitions_registered=registered, partitions_present=present
        )

    # -- reads ----------------------------------------------------------------------------------

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
        ((value,),) = self.query(f"SELECT count(*) FROM {self._table_ref(table)}{where}", params)
        return int(value)
