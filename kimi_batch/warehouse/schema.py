"""One mapping from row-model fields to polars dtypes and Trino SQL types.

Parquet files and Trino tables are both derived from the pydantic row models in
`kimi_batch.pipeline.rows`, so the two can never drift apart:

    str, Literal[str, ...]  -> String              / VARCHAR
    int                     -> Int64               / BIGINT
    float                   -> Float64             / DOUBLE
    bool                    -> Boolean             / BOOLEAN
    datetime                -> Datetime("us")      / TIMESTAMP(6)   (UTC, stored without zone)
    X | None                -> nullable X
    list[X]                 -> List(X)             / ARRAY(X)
    nested BaseModel        -> Struct(...)         / ROW(...)

The Hive partition columns `ds` and `source` are VARCHAR and always come last.
"""

from __future__ import annotations

import re
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any, Literal, Union, get_args, get_origin

import polars as pl
from pydantic import BaseModel

from kimi_batch.pipeline import PARTITION_COLUMNS, STAGES, QuarantineRow, SeedRow
from kimi_batch.storage import InvalidIdentifierError, InvalidPartitionError

# The Iceberg catalog's own name in its tables (pyiceberg's SqlCatalog name, Trino's
# `iceberg.jdbc-catalog.catalog-name`): the writers and Trino must agree on it.
CATALOG_NAME = "kimi_batch"
# The ledger's schema on PostgreSQL (`StatePaths.ledger_state`): the catalog sits beside the
# partition leases there.
LEDGER_SCHEMA = "kimi_ledger"


class _Tables(Mapping[str, type[BaseModel]]):
    """`seeds`, every registered generation stage's table, `quarantine`; read when asked, so a
    stage declared later (`kimi_batch.pipeline.declare_stage`) is a table at once."""

    def _tables(self) -> dict[str, type[BaseModel]]:
        stages = {stage.table: stage.row_model for stage in STAGES.values()}
        return {"seeds": SeedRow, **stages, "quarantine": QuarantineRow}

    def __getitem__(self, table: str) -> type[BaseModel]:
        return self._tables()[table]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tables())

    def __len__(self) -> int:
        return len(self._tables())


TABLES: Mapping[str, type[BaseModel]] = _Tables()
"""Output table name -> row model."""

_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]*$")
_DS = re.compile(r"^\d{4}-\d{2}-\d{2}$")
# First character alphanumeric: Hive-style readers skip paths that start with "." or "_".
_SOURCE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def validate_ds(ds: str | date) -> str:
    """`ds` as an ISO date string (YYYY-MM-DD); a `date` is accepted."""
    if isinstance(ds, datetime):
        raise InvalidPartitionError(f"ds must be a date, not a datetime: {ds!r}")
    if isinstance(ds, date):
        return ds.isoformat()
    if not isinstance(ds, str) or not _DS.fullmatch(ds):
        raise InvalidPartitionError(f"ds must be an ISO date YYYY-MM-DD, got {ds!r}")
    try:
        date.fromisoformat(ds)
    except ValueError as error:
        raise InvalidPartitionError(f"ds is not a valid date: {ds!r}") from error
    return ds


def validate_source(source: str) -> str:
    """`source` if it is 1-128 characters of [A-Za-z0-9_.-], starting alphanumeric."""
    if not isinstance(source, str) or not _SOURCE.fullmatch(source):
        raise InvalidPartitionError(
            f"source must be 1-128 characters of [A-Za-z0-9_.-] starting with a letter or digit, "
            f"got {source!r}"
        )
    return source


def validate_identifier(name: str, *, what: str = "identifier") -> str:
    """Return `name` if it is a plain lower-case SQL identifier, else raise InvalidIdentifierError."""
    if not isinstance(name, str) or not _IDENTIFIER.fullmatch(name) or len(name) > 128:
        raise InvalidIdentifierError(
            f"invalid {what} {name!r}: must match ^[a-z_][a-z0-9_]*$ (at most 128 characters)"
        )
    return name


def quote_identifier(name: str) -> str:
    """Double-quote a validated identifier (quoting also keeps reserved words usable)."""
    return f'"{validate_identifier(name)}"'


def validate_table(table: str) -> str:
    """Return `table` if it names one of the output tables."""
    validate_identifier(table, what="table")
    if table not in TABLES:
        raise InvalidPartitionError(f"unknown table {table!r}; expected one of {sorted(TABLES)}")
    return table


def model_for(table: str) -> type[BaseModel]:
    return TABLES[validate_table(table)]


@dataclass(frozen=True, kw_only=True)
class Column:
    """One column of an output table."""

    name: str
    polars: pl.DataType
    trino: str
    nullable: bool


def _unwrap_optional(annotation: Any) -> tuple[Any, bool]:
    origin = get_origin(annotation)
    if origin is Union or origin is types.UnionType:
        args = [arg for arg in get_args(annotation) if arg is not type(None)]
        if len(args) != 1:
            raise TypeError(f"only `X | None` unions are supported, got {annotation!r}")
        return args[0], True
    return annotation, False


def _types(annotation: Any) -> tuple[pl.DataType, str]:
    """polars dtype and Trino type of a non-optional annotation."""
    origin = get_origin(annotation)
    if origin is Literal:
        if not all(isinstance(value, str) for value in get_args(annotation)):
            raise TypeError(f"only string literals are supported, got {annotation!r}")
        return pl.String(), "VARCHAR"
    if origin is list:
        (item,) = get_args(annotation)
        item, _ = _unwrap_optional(item)
        inner_polars, inner_trino = _types(item)
        return pl.List(inner_polars), f"ARRAY({inner_trino})"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        fields = columns(annotation)
        struct = pl.Struct({field.name: field.polars for field in fields})
        row = ", ".join(f"{quote_identifier(field.name)} {field.trino}" for field in fields)
        return struct, f"ROW({row})"
    # bool before int: bool is a subclass of int.
    scalars: dict[Any, tuple[pl.DataType, str]] = {
        bool: (pl.Boolean(), "BOOLEAN"),
        int: (pl.Int64(), "BIGINT"),
        float: (pl.Float64(), "DOUBLE"),
        str: (pl.String(), "VARCHAR"),
        datetime: (pl.Datetime("us"), "TIMESTAMP(6)"),
    }
    if annotation in scalars:
        return scalars[annotation]
    raise TypeError(f"no storage type for annotation {annotation!r}")


def columns(model: type[BaseModel]) -> tuple[Column, ...]:
    """The columns of a row model, in field order (partition columns not included)."""
    result: list[Column] = []
    for name, field in model.model_fields.items():
        validate_identifier(name, what=f"column of {model.__name__}")
        annotation, nullable = _unwrap_optional(field.annotation)
        polars_type, trino_type = _types(annotation)
        result.append(Column(name=name, polars=polars_type, trino=trino_type, nullable=nullable))
    return tuple(result)


def _table_columns(table: str) -> tuple[Column, ...]:
    result = columns(model_for(table))
    clash = {column.name for column in result} & set(PARTITION_COLUMNS)
    if clash:
        raise TypeError(f"{table}: fields {sorted(clash)} clash with the partition columns")
    return result


def polars_schema(table: str, *, partitions: bool = False) -> pl.Schema:
    """The polars schema of a table's files; with `partitions`, `ds` and `source` appended."""
    schema = pl.Schema({column.name: column.polars for column in _table_columns(table)})
    if partitions:
        for name in PARTITION_COLUMNS:
            schema[name] = pl.String()
    return schema


def trino_columns(table: str) -> list[tuple[str, str]]:
    """(name, Trino type) of every column, partition columns last."""
    result = [(column.name, column.trino) for column in _table_columns(table)]
    result.extend((name, "VARCHAR") for name in PARTITION_COLUMNS)
    return result
