"""The tables' Iceberg catalog: pyiceberg's SQL catalog in the ledger's state database.

The catalog lives where the partition leases live (the ledger's SQLite file by default, the
`kimi_ledger` schema of `KIMI_BATCH_DATABASE_URL` for a team), so a partition write's lease is
confirmed inside the catalog commit's own transaction: `commit_fenced` hands the commit's
connection to the lease (`Fence.confirm_in`) just before the metadata swap commits. A writer
whose lease ran out, even between its last check and the swap, commits nothing. Trino's Iceberg
connector reads the same catalog through JDBC (`scripts/trino.sh`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, SecretStr
from pyiceberg.catalog.sql import SqlCatalog
from sqlalchemy import event
from sqlalchemy.orm import Session

from kimi_batch.paths import StatePaths, connect_private_db, private_dir
from kimi_batch.settings import Settings
from kimi_batch.state import Fence, SqliteDatabase, StateDatabase

CATALOG_NAME = "kimi_batch"
# The ledger's schema on PostgreSQL (`StatePaths.ledger_state`): the leases are there.
LEDGER_SCHEMA = "kimi_ledger"
# Writers that may race on one table's metadata swap: pyiceberg retries a lost compare-and-swap
# this many times (each retry re-reads the table and re-applies the partition's overwrite).
COMMIT_RETRIES = 32


class CatalogSpec(BaseModel):
    """Where the catalog and the table files are."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    database: SecretStr  # the SQLAlchemy URL (a PostgreSQL one may hold a password)
    sqlite_path: Path | None = None
    warehouse: str  # the root URL of the table files: file:///... or s3://bucket/prefix
    namespace: str
    s3_endpoint: str | None = None
    s3_region: str | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> CatalogSpec:
        return cls.from_paths(
            settings.paths,
            namespace=settings.trino_schema,
            s3_endpoint=settings.s3_endpoint,
            s3_region=settings.s3_region,
        )

    @classmethod
    def from_paths(
        cls,
        paths: StatePaths,
        *,
        namespace: str = "kimi_batch",
        s3_endpoint: str | None = None,
        s3_region: str | None = None,
    ) -> CatalogSpec:
        """The catalog in the ledger's database of the state `paths`, the files in its
        warehouse (folder or URL)."""
        root = paths.warehouse_url or paths.warehouse_dir.expanduser().resolve().as_uri()
        if paths.database_url is None:
            path = paths.ledger_path.expanduser().resolve()
            # A generous busy timeout: commits of several workers queue on SQLite's write lock.
            database, sqlite_path = f"sqlite:///{path}?timeout=60", path
        else:
            database, sqlite_path = _sqlalchemy_postgres(paths.database_url), None
        return cls(
            database=SecretStr(database),
            sqlite_path=sqlite_path,
            warehouse=root.rstrip("/"),
            namespace=namespace,
            s3_endpoint=s3_endpoint,
            s3_region=s3_region,
        )

    @classmethod
    def for_folder(cls, folder: Path, *, namespace: str = "kimi_batch") -> CatalogSpec:
        """A folder warehouse in the state dir's layout: the catalog in `../ledger/`."""
        folder = folder.expanduser().resolve()
        paths = StatePaths(home=folder.parent, warehouse_override=folder)
        return cls.from_paths(paths, namespace=namespace)

    def properties(self) -> dict[str, str]:
        """pyiceberg's catalog properties (the AWS variables give S3 credentials)."""
        properties = {"uri": self.database.get_secret_value(), "warehouse": self.warehouse}
        if self.s3_endpoint:
            properties["s3.endpoint"] = self.s3_endpoint
            properties["s3.force-virtual-addressing"] = "false"
        if self.s3_region:
            properties["s3.region"] = self.s3_region
        return properties


def _sqlalchemy_postgres(url: str) -> str:
    """`postgresql://...` as SQLAlchemy's psycopg 3 URL, on the ledger's schema."""
    parts = urlsplit(url)
    query = "&".join(q for q in (parts.query, f"options=-csearch_path%3D{LEDGER_SCHEMA}") if q)
    return urlunsplit(("postgresql+psycopg", parts.netloc, parts.path, query, parts.fragment))


_catalogs_lock = threading.Lock()


@lru_cache(maxsize=8)
def _catalog(spec: CatalogSpec) -> SqlCatalog:
    if spec.sqlite_path is None:
        _create_schema(spec)
    elif not spec.sqlite_path.exists():
        # The ledger's file, created owner-only and in WAL mode as the ledger creates it.
        private_dir(spec.sqlite_path.parent)
        connect_private_db(spec.sqlite_path).close()
    # Creates its own tables (iceberg_tables, iceberg_namespace_properties) if missing; the
    # namespace comes with the first table.
    return SqlCatalog(CATALOG_NAME, **spec.properties())


def _create_schema(spec: CatalogSpec) -> None:
    from sqlalchemy import create_engine, text

    engine = create_engine(spec.database.get_secret_value())
    try:
        with engine.begin() as connection:
            connection.execute(text(f"CREATE SCHEMA IF NOT EXISTS {LEDGER_SCHEMA}"))
    finally:
        engine.dispose()


def open_catalog(spec: CatalogSpec) -> SqlCatalog:
    """The catalog of `spec`, its tables created if missing (one per process and spec: it
    holds a connection pool)."""
    with _catalogs_lock:
        return _catalog(spec)  # pyright: ignore[reportArgumentType] - frozen: hashable


# The fence of the commit this thread is making (None: a commit that needs none).
_FENCE: ContextVar[tuple[Fence, CatalogSpec] | None] = ContextVar("_FENCE", default=None)


@contextmanager
def commit_fenced(fence: Fence | None, spec: CatalogSpec) -> Iterator[None]:
    """Catalog commits made inside confirm `fence` in their own transaction."""
    token = _FENCE.set(None if fence is None else (fence, spec))
    try:
        yield
    finally:
        _FENCE.reset(token)


def _state_database(session: Session, spec: CatalogSpec) -> StateDatabase:
    """The session's connection, inside its transaction, as a `StateDatabase`."""
    raw: Any = session.connection().connection.dbapi_connection
    if spec.sqlite_path is not None:
        return SqliteDatabase.wrap(raw, spec.sqlite_path)
    from kimi_batch.state import PostgresDatabase

    return PostgresDatabase.wrap(raw, spec.database.get_secret_value(), LEDGER_SCHEMA)


@event.listens_for(Session, "before_commit")
def _confirm_lease(session: Session) -> None:
    """pyiceberg's catalog commit is one session: its metadata swap is executed, not yet
    committed, when this runs; the lease is confirmed in the same transaction, or the commit
    raises and the swap is rolled back."""
    fenced = _FENCE.get()
    if fenced is None:
        return
    fence, spec = fenced
    fence.confirm_in(_state_database(session, spec))
