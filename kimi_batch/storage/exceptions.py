"""Exceptions of the storage layer.

StorageError                      base (a kimi_batch.errors.KimiBatchError): anything the storage layer refuses or fails to do
├── InvalidPartitionError         bad table name, `ds` or `source` (also a ValueError)
├── InvalidIdentifierError        a schema/table/catalog name that is not a plain SQL identifier
│                                 (also a ValueError); raised before any SQL is sent
├── SchemaMismatchError           an existing Trino table whose columns differ from the row model
├── TrinoUnavailableError         Trino cannot be reached (refused, timed out, HTTP 5xx)
└── TrinoQueryError               Trino answered with an error for a statement
    └── TrinoTimeoutError         a statement did not finish within its deadline; it was cancelled
"""

from __future__ import annotations

from kimi_batch.errors import KimiBatchError


class StorageError(KimiBatchError):
    """Base of every storage-layer error."""


class InvalidPartitionError(StorageError, ValueError):
    """A table name, `ds` or `source` that cannot name a Hive partition."""


class InvalidIdentifierError(StorageError, ValueError):
    """A catalog, schema, table or column name that is not `^[a-z_][a-z0-9_]*$`."""


class SchemaMismatchError(StorageError):
    """The Trino table exists with other columns than the row model has."""


class TrinoUnavailableError(StorageError):
    """Trino could not be reached; the Parquet files are unaffected."""


class TrinoQueryError(StorageError):
    """Trino rejected or failed a statement."""


class TrinoTimeoutError(TrinoQueryError):
    """A statement ran (or stayed queued) past its overall deadline and was cancelled."""
