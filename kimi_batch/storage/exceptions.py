"""Exceptions of the storage layer.

StorageError                      base (a kimi_batch.errors.KimiBatchError): anything the storage layer refuses or fails to do
├── InvalidPartitionError         bad table name, `ds` or `source` (also a ValueError)
└── InvalidIdentifierError        a schema/table/catalog name that is not a plain SQL
                                  identifier (also a ValueError); raised before any SQL is sent

The features raise their own subclasses (the warehouse's Trino errors are in
`kimi_batch.warehouse`), so one `except StorageError` still catches them all.
"""

from __future__ import annotations

from kimi_batch.errors import KimiBatchError


class StorageError(KimiBatchError):
    """Base of every storage-layer error."""


class InvalidPartitionError(StorageError, ValueError):
    """A table name, `ds` or `source` that cannot name a Hive partition."""


class InvalidIdentifierError(StorageError, ValueError):
    """A catalog, schema, table or column name that is not `^[a-z_][a-z0-9_]*$`."""
