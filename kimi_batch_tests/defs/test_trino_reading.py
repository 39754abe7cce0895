"""Batch outputs read by a real Trino over the pipeline's own catalog: the counts Trino, polars and
the warehouse give agree with no publish step; a Trino outage leaves the run alone and the
morning report names it."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import dagster as dg
import polars as pl
import pytest

from kimi_batch.definitions import batch_assets, build_resources
from kimi_batch.defs.partitions import SOURCE_PARTITIONS_NAME
from kimi_batch.pipeline import trino_problem
from kimi_batch.settings import Settings
from kimi_batch.warehouse import TrinoConfig, TrinoReader, open_catalog, open_warehouse
from kimi_batch_tests.support.llama_server import LlamaEnv
from kimi_batch_tests.support.ports import free_port
from kimi_batch_tests.support.trino import TrinoServer

pytestmark = pytest.mark.slow  # real llama-server and a real Trino

RUN_CONFIG: dict[str, Any] = {
    "ops": {
        "amplified_prompts": {
            "config": {"strategies": ["paraphrase", "related"], "max_tokens": 32}
        },
        "distilled_responses": {"config": {"max_tokens": 24}},
    }
}
TABLES = ("seeds", "amplified", "distilled", "quarantine")


def _today() -> str:
    return datetime.now(UTC).date().isoformat()


def _inbox(env: LlamaEnv, source: str, n: int) -> None:
    inbox = env.home / "inbox"
    inbox.mkdir(parents=True, exist_ok=True)
    rows = [
        json.dumps({"id": f"{source}-{i}", "prompt": f"Why is the sky blue, part {i}?"})
        for i in range(n)
    ]
    (inbox / f"{source}.jsonl").write_text("\n".join(rows) + "\n", encoding="utf-8")


def _materialize(instance: dg.DagsterInstance, source: str) -> dg.ExecuteInProcessResult:
    """Materialize a batch with the deployment's settings as the environment has them."""
    instance.add_dynamic_partitions(SOURCE_PARTITIONS_NAME, [source])
    return dg.materialize(
        batch_assets(Settings.from_env()),
        partition_key=dg.MultiPartitionKey({"date": _today(), "source": source}),
        resources=build_resources(Settings.from_env()),
        instance=instance,
        run_config=RUN_CONFIG,
    )


def _use_trino(
    monkeypatch: pytest.MonkeyPatch, server: TrinoServer, port: int | None = None
) -> None:
    """The deployment's Trino, set the way a deployment sets it."""
    monkeypatch.setenv("KIMI_BATCH_TRINO_HOST", server.host)
    monkeypatch.setenv("KIMI_BATCH_TRINO_PORT", str(port or server.port))


def _counts(reader: TrinoReader, source: str) -> dict[str, int]:
    return {table: reader.count(table, _today(), source) for table in TABLES}


def test_trino_and_polars_count_what_the_run_committed_and_a_rerun_does_not_double_it(
    llama_env: LlamaEnv, llama_trino: TrinoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    _inbox(llama_env, "read", 3)
    _use_trino(monkeypatch, llama_trino)
    settings = Settings.from_env()
    with dg.instance_for_test() as instance:
        first = _materialize(instance, "read")
        assert first.success
        checks = {c.check_name for c in first.get_asset_check_evaluations()}
        assert "published_to_trino" not in checks
        (materialization,) = first.asset_materializations_for_node("distilled_responses")
        assert (
            materialization.metadata["dagster/table_name"].value == "iceberg.kimi_batch.distilled"
        )
        warehouse = open_warehouse(settings)
        with TrinoReader(TrinoConfig.from_settings(settings)) as reader:
            counts = _counts(reader, "read")
            joined = reader.query(
                f"SELECT count(*) FROM {reader.table_ref('distilled')} d "
                f"JOIN {reader.table_ref('amplified')} a ON d.input_id = a.request_id "
                "WHERE d.source = 'read' AND a.source = 'read'"
            )[0][0]
        for table in TABLES:
            frame = pl.scan_iceberg(
                open_catalog(warehouse.spec).load_table(warehouse.identifier(table))
            ).filter((pl.col("ds") == _today()) & (pl.col("source") == "read"))
            assert (
                counts[table]
                == frame.collect().height
                == warehouse.read_partition(table, _today(), "read").height
            )
        assert counts["seeds"] == 3
        assert counts["amplified"] > 0
        distilled = warehouse.read_partition("distilled", _today(), "read")
        assert joined == distilled.filter(pl.col("origin") == "variant").height

        again = _materialize(instance, "read")
        assert again.success
        with TrinoReader(TrinoConfig.from_settings(settings)) as reader:
            assert _counts(reader, "read") == counts


def test_a_trino_outage_leaves_the_run_alone_and_the_morning_report_names_it(
    llama_env: LlamaEnv, llama_trino: TrinoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    _inbox(llama_env, "outage", 2)
    dead = free_port()  # nothing listens there: Trino is "stopped"
    _use_trino(monkeypatch, llama_trino, port=dead)
    with dg.instance_for_test() as instance:
        result = _materialize(instance, "outage")
    assert result.success
    down = trino_problem(Settings.from_env(), _today())
    _use_trino(monkeypatch, llama_trino)
    settings = Settings.from_env()
    up = trino_problem(settings, _today())
    with TrinoReader(TrinoConfig.from_settings(settings)) as reader:
        counts = _counts(reader, "outage")
    assert "unreachable" in down
    assert f"127.0.0.1:{dead}" in down
    assert up == ""
    # Nothing to catch up: the rows committed during the outage are there.
    warehouse = open_warehouse(settings)
    assert counts == {
        table: warehouse.read_partition(table, _today(), "outage").height for table in TABLES
    }
    assert counts["seeds"] == 2
