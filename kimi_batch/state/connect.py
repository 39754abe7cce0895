"""Which backend a store opens: its SQLite file, or its schema of the PostgreSQL database."""

from __future__ import annotations

from kimi_batch.paths import StateLocation
from kimi_batch.redaction import masked_url
from kimi_batch.state.database import StateDatabase
from kimi_batch.state.sqlite import SqliteDatabase, read_sqlite

# The PostgreSQL backend is imported where it is chosen: psycopg costs every process that loads
# the code location ~0.4 s, and the embedded default never uses it.


def connect_state(location: StateLocation, *, timeout_s: float = 60.0) -> StateDatabase:
    """The store's database, created if new: its SQLite file, or its PostgreSQL schema."""
    if location.url is None:
        return SqliteDatabase(location.path, timeout_s=timeout_s)
    from kimi_batch.state.postgres import PostgresDatabase

    return PostgresDatabase(location.url, location.schema_name, timeout_s=timeout_s)


def read_state(location: StateLocation) -> StateDatabase | None:
    """The store for reading only, or None when it was never written (nothing is created)."""
    if location.url is None:
        return read_sqlite(location.path)
    from kimi_batch.state.postgres import read_postgres

    return read_postgres(location.url, location.schema_name)


def shown_location(location: StateLocation) -> str:
    """Where the store is, as messages and `status` name it (no password)."""
    if location.url is None:
        return str(location.path)
    return f"{masked_url(location.url)} (schema {location.schema_name})"
