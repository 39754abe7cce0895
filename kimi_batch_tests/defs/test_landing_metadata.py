"""Dagster's standard table metadata: the column schema from the row models, the counts."""

from __future__ import annotations

import dagster as dg

from kimi_batch.defs.assets.stage_asset import (
    COLUMN_SCHEMA,
    PARTITION_ROW_COUNT,
    ROW_COUNT,
    TABLE_NAME,
    URI,
    on_table,
    table_metadata,
    table_schema,
)
from kimi_batch.warehouse import TABLES, trino_columns


def test_every_tables_schema_is_its_row_models_with_the_partition_columns_last() -> None:
    for table in TABLES:
        schema = table_schema(table)
        assert [(c.name, c.type) for c in schema.columns] == trino_columns(table), table
    distilled = {column.name: column for column in table_schema("distilled").columns}
    assert distilled["request_id"].description  # the row model's field description
    assert distilled["request_id"].constraints.nullable is False


def test_the_standard_keys_with_and_without_a_partition() -> None:
    values = table_metadata(
        "seeds", table_name="hive.kimi_batch.seeds", uri="/w/seeds/x.parquet", table_rows=7
    )
    assert set(values) == {ROW_COUNT, TABLE_NAME, URI, COLUMN_SCHEMA}
    assert values[ROW_COUNT] == dg.MetadataValue.int(7)
    assert isinstance(values[COLUMN_SCHEMA], dg.TableSchemaMetadataValue)
    partitioned = table_metadata("seeds", table_name="t", uri="u", table_rows=7, partition_rows=2)
    assert partitioned[PARTITION_ROW_COUNT] == dg.MetadataValue.int(2)


def test_a_check_names_the_table_it_judged() -> None:
    values = table_metadata("seeds", table_name="hive.s.seeds", uri="/f.parquet", table_rows=1)
    check = dg.AssetCheckResult(check_name="c", passed=True, metadata={"empty": 0})
    [named] = on_table([check], values)
    assert named.metadata["empty"] == dg.MetadataValue.int(0)
    assert named.metadata[TABLE_NAME] == dg.MetadataValue.text("hive.s.seeds")
    assert named.metadata[URI] == dg.MetadataValue.text("/f.parquet")
