"""The state databases: one interface and the SQLite backend (`database`), PostgreSQL (`postgres`).

The ledger (with the partition leases), the landing manifest, the Batch API store and the quality
gate's duplicate index each open
their tables through `connect_state(location)` (`database`): a SQLite file under the state dir by
default, a schema of the PostgreSQL database `KIMI_BATCH_DATABASE_URL` names when it is set
(`StatePaths.ledger_state`, `manifest_state`, `api_state`, `dedup_state`). `read_state` opens one for reading
without creating anything; `copy_store` copies a store's SQLite file into another backend
(`kimi-batch state migrate`). A `Fence` (a partition lease) is confirmed in a transaction of its
store around the commit of a write. Other layers import this facade.
"""

import typing

from kimi_batch.state.database import (
    Cursor,
    SqliteDatabase,
    StateBusyError,
    StateDatabase,
    StateError,
    boot_clock,
    connect_state,
    read_state,
    shown_location,
)
from kimi_batch.state.fence import Fence
from kimi_batch.state.migrate import StoreCopy, copy_store

if typing.TYPE_CHECKING:
    from kimi_batch.state.postgres import POSTGRES_CLOCK, PostgresDatabase, shown_url

__all__ = [
    "POSTGRES_CLOCK",
    "Cursor",
    "Fence",
    "PostgresDatabase",
    "SqliteDatabase",
    "StateBusyError",
    "StateDatabase",
    "StateError",
    "StoreCopy",
    "boot_clock",
    "connect_state",
    "copy_store",
    "read_state",
    "shown_location",
    "shown_url",
]

_LAZY_MEMBERS = frozenset({"POSTGRES_CLOCK", "PostgresDatabase", "shown_url"})


def __getattr__(name: str) -> object:
    """The PostgreSQL backend's members, imported on first use: psycopg costs every process
    that loads the code location ~0.4 s, and the embedded default never needs it."""
    if name in _LAZY_MEMBERS:
        from kimi_batch.state import postgres

        return getattr(postgres, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
