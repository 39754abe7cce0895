"""Materialization metadata people can read: rounded to what the figures mean, units in the keys.

Dagster plots numeric metadata over a partition's materializations, so every figure stays a
number (`pipeline.generation_figures`); the `summary` entry repeats the latest ones as a small
Markdown table for the UI.

Every table materialization also carries Dagster's standard keys (`table_metadata`): the row
counts, the table's name in Trino, its file's URI and its column schema from the row models, which
fill the catalog's row-count chart, schema tab and table name. Dagster spells these keys in
`TableMetadataSet`/`UriMetadataSet`, which `dagster` 1.13 does not export: they are named once
here, their values built with the public `dg.TableSchema`/`dg.TableColumn`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import dagster as dg

from kimi_batch.warehouse import PARTITION_COLUMNS, TABLES, columns

ROW_COUNT = "dagster/row_count"
PARTITION_ROW_COUNT = "dagster/partition_row_count"
TABLE_NAME = "dagster/table_name"
URI = "dagster/uri"
COLUMN_SCHEMA = "dagster/column_schema"
# The Iceberg snapshot of the table that a materialization's commit made current.
SNAPSHOT_ID = "snapshot_id"
# Who answers for every asset of the pipeline (the UI's owner filter and catalog column).
ASSET_OWNERS = ["team:kimi-batch"]


def table_schema(table: str) -> dg.TableSchema:
    """The table's columns as its row model declares them (`warehouse.schema`'s Trino types), the
    partition columns last."""
    model = TABLES[table]
    fields = [
        dg.TableColumn(
            name=column.name,
            type=column.trino,
            description=model.model_fields[column.name].description,
            constraints=dg.TableColumnConstraints(nullable=column.nullable),
        )
        for column in columns(model)
    ]
    partition_columns = [
        dg.TableColumn(
            name=name,
            type="VARCHAR",
            description="partition column",
            constraints=dg.TableColumnConstraints(nullable=False),
        )
        for name in PARTITION_COLUMNS
    ]
    return dg.TableSchema(columns=[*fields, *partition_columns])


def table_metadata(
    table: str,
    *,
    table_name: str,
    uri: str,
    table_rows: int,
    partition_rows: int | None = None,
    snapshot_id: int | None = None,
) -> dict[str, dg.RawMetadataValue]:
    """Dagster's standard table keys: rows in the whole table (and in the partition written),
    the Trino table, the Iceberg table's location and the column schema; and the table's
    snapshot the write made current (`kimi-batch export --as-of` reads it back)."""
    metadata: dict[str, dg.RawMetadataValue] = {
        ROW_COUNT: dg.MetadataValue.int(table_rows),
        TABLE_NAME: dg.MetadataValue.text(table_name),
        URI: dg.MetadataValue.text(uri),
        COLUMN_SCHEMA: dg.MetadataValue.table_schema(table_schema(table)),
    }
    if partition_rows is not None:
        metadata[PARTITION_ROW_COUNT] = dg.MetadataValue.int(partition_rows)
    if snapshot_id is not None:
        # Text: a snapshot id is a 63-bit number, past what the UI's numeric charts keep exact.
        metadata[SNAPSHOT_ID] = dg.MetadataValue.text(str(snapshot_id))
    return metadata


def on_table(
    checks: Sequence[dg.AssetCheckResult], metadata: Mapping[str, dg.RawMetadataValue]
) -> list[dg.AssetCheckResult]:
    """`checks` with the table name and URI of the materialization they judged (`metadata`)."""
    keys = {key: metadata[key] for key in (TABLE_NAME, URI) if key in metadata}
    return [check.with_metadata({**check.metadata, **keys}) for check in checks]
