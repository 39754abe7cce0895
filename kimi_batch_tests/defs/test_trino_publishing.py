"""Batch outputs land in a real Trino; an outage is reported and `kimi-batch publish` catches up;
an object-store warehouse is read by Trino where it is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import dagster as dg
import polars as pl
import pytest

from kimi_batch.definitions import batch_assets, build_resources
from kimi_batch.defs.check_states import failed_checks, published_checks
from kimi_batch.defs.partitions import SOURCE_PARTITIONS_NAME
from kimi_batch.defs.publishing import build_trino_catch_up
from kimi_batch.settings import Settings
from kimi_batch.storage import (
    TrinoConfig,
    TrinoPublisher,
)
from kimi_batch.warehouse import Warehouse, open_warehouse
from kimi_batch_tests.support.llama_server import LlamaEnv
from kimi_batch_tests.support.ports import free_port
from kimi_batch_tests.support.s3proxy import BUCKET, S3Server
from kimi_batch_tests.support.trino import TrinoServer

pytestmark = pytest.mark.slow  # real llama-server, real Trino and the CLI in a child process

RUN_CONFIG: dict[str, Any] = {
    "ops": {
        "amplified_prompts": {
            "config": {"strategies": ["paraphrase", "related"], "max_tokens": 32}
        },
        "distilled_responses": {"config": {"max_tokens": 24}},
    }
}
SCHEMA = "pipeline"


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


def _materialize(
    instance: dg.DagsterInstance, source: str, warehouse: Warehouse, trino: dict[str, str]
) -> dg.ExecuteInProcessResult:
    """Materialize with the deployment's Trino and warehouse set the way a deployment sets them."""
    instance.add_dynamic_partitions(SOURCE_PARTITIONS_NAME, [source])
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KIMI_BATCH_WAREHOUSE", str(warehouse.root))
        for name, value in trino.items():
            patch.setenv(name, value)
        return dg.materialize(
            batch_assets(Settings.from_env()),
            partition_key=dg.MultiPartitionKey({"date": _today(), "source": source}),
            resources=build_resources(Settings.from_env()),
            instance=instance,
            run_config=RUN_CONFIG,
        )


def _trino_env(config: TrinoConfig, *, port: int | None = None) -> dict[str, str]:
    return {
        "KIMI_BATCH_TRINO_HOST": config.host,
        "KIMI_BATCH_TRINO_PORT": str(port or config.port),
        "KIMI_BATCH_TRINO_SCHEMA": config.schema_name,
        "KIMI_BATCH_TRINO_WAREHOUSE_LOCATION": config.warehouse_location,
    }


@pytest.fixture(scope="module")
def isolated(trino_server: TrinoServer) -> tuple[Warehouse, TrinoConfig]:
    return trino_server.isolated(SCHEMA)


def test_counts_match_parquet_and_a_rerun_does_not_double_them(
    llama_env: LlamaEnv, isolated: tuple[Warehouse, TrinoConfig]
) -> None:
    warehouse, config = isolated
    _inbox(llama_env, "published", 3)
    with dg.instance_for_test() as instance:
        first = _materialize(instance, "published", warehouse, _trino_env(config))
        assert first.success
        published = [
            c for c in first.get_asset_check_evaluations() if c.check_name == "published_to_trino"
        ]
        assert len(published) == 3  # seeds, amplified, distilled (each with its quarantine)
        assert all(check.passed for check in published)
        (materialization,) = first.asset_materializations_for_node("distilled_responses")
        assert materialization.metadata["dagster/table_name"].value == f"hive.{SCHEMA}.distilled"
        assert "SELECT" in str(materialization.metadata["query"].value)

        with TrinoPublisher(config) as trino:
            counts = {t: trino.count(t) for t in ("seeds", "distilled", "amplified", "quarantine")}
            joined = trino.query(
                f"SELECT count(*) FROM hive.{SCHEMA}.distilled d "
                f"JOIN hive.{SCHEMA}.amplified a ON d.input_id = a.request_id"
            )[0][0]
        assert counts["seeds"] == warehouse.count("seeds") == 3
        distilled = warehouse.read_partition("distilled", _today(), "published")
        set_aside = warehouse.read_partition("quarantine", _today(), "published").filter(
            pl.col("stage") == "distill"
        )
        assert counts["distilled"] == warehouse.count("distilled")
        assert counts["amplified"] == warehouse.count("amplified") > 0
        assert counts["quarantine"] == warehouse.count("quarantine")
        # Every seed and variant has an answer: final (distilled) or set aside (cut off).
        assert distilled.height + set_aside.height == 3 + warehouse.count("amplified")
        # Each distilled variant joins its amplified row in Trino.
        assert joined == distilled.filter(pl.col("origin") == "variant").height

        again = _materialize(instance, "published", warehouse, _trino_env(config))
        assert again.success
        with TrinoPublisher(config) as trino:
            assert {t: trino.count(t) for t in counts} == counts


def test_an_unreachable_trino_keeps_the_parquet_and_publish_catches_up(
    llama_env: LlamaEnv, isolated: tuple[Warehouse, TrinoConfig], trino_server: TrinoServer
) -> None:
    warehouse, config = isolated
    _inbox(llama_env, "outage", 2)
    down = _trino_env(config, port=free_port())  # nothing listens there: Trino is "stopped"
    with dg.instance_for_test() as instance:
        result = _materialize(instance, "outage", warehouse, down)
    assert result.success
    assert warehouse.partition_file("distilled", _today(), "outage").is_file()
    publish_checks = [
        c for c in result.get_asset_check_evaluations() if c.check_name == "published_to_trino"
    ]
    assert len(publish_checks) == 3
    assert not any(check.passed for check in publish_checks)
    assert all("reason" in check.metadata for check in publish_checks)

    env = {
        **os.environ,
        "KIMI_BATCH_WAREHOUSE": str(warehouse.root),
        "KIMI_BATCH_TRINO_HOST": trino_server.host,
        "KIMI_BATCH_TRINO_PORT": str(trino_server.port),
        "KIMI_BATCH_TRINO_SCHEMA": SCHEMA,
        "KIMI_BATCH_TRINO_WAREHOUSE_LOCATION": config.warehouse_location,
    }
    published = subprocess.run(
        [sys.executable, "-m", "kimi_batch.cli", "publish"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert published.returncode == 0, published.stderr
    assert json.loads(published.stdout)["partitions_registered"] >= 1
    with TrinoPublisher(config) as trino:
        for table in ("seeds", "distilled", "amplified", "quarantine"):
            assert trino.count(table) == warehouse.count(table)
            assert trino.count(table, _today(), "outage") == len(
                warehouse.read_partition(table, _today(), "outage")
            )


def test_an_outage_is_caught_up_by_the_sensor_once_trino_is_back(
    llama_env: LlamaEnv, isolated: tuple[Warehouse, TrinoConfig]
) -> None:
    warehouse, config = isolated
    _inbox(llama_env, "sensed", 2)
    down = _trino_env(config, port=free_port())
    with dg.instance_for_test() as instance, pytest.MonkeyPatch.context() as patch:
        assert _materialize(instance, "sensed", warehouse, down).success
        patch.setenv("KIMI_BATCH_WAREHOUSE", str(warehouse.root))
        for name, value in down.items():
            patch.setenv(name, value)
        still_down = build_trino_catch_up(Settings.from_env())(
            dg.build_sensor_context(instance=instance)
        )
        unpublished = failed_checks(instance, keys=published_checks())
        for name, value in _trino_env(config).items():
            patch.setenv(name, value)
        back = build_trino_catch_up(Settings.from_env())(dg.build_sensor_context(instance=instance))
        assert isinstance(back, dg.SensorResult)
        for event in back.asset_events:
            assert isinstance(event, dg.AssetCheckEvaluation)
            instance.report_runless_asset_event(event)  # what the daemon does with them
        left = failed_checks(instance, keys=published_checks())

    assert isinstance(still_down, dg.SensorResult)
    assert still_down.asset_events == []
    key = f"{_today()}|sensed"
    assert {(item.asset, item.partition) for item in unpublished} == {
        (asset, key) for asset in ("seed_prompts", "amplified_prompts", "distilled_responses")
    }
    assert len(back.asset_events) == 3
    assert left == []
    with TrinoPublisher(config) as trino:
        for table in ("seeds", "distilled", "amplified", "quarantine"):
            assert trino.count(table, _today(), "sensed") == len(
                warehouse.read_partition(table, _today(), "sensed")
            )


def test_a_partition_on_object_storage_is_read_there_by_trino_and_replaced_whole(
    llama_env: LlamaEnv, trino_server: TrinoServer, s3proxy_server: S3Server
) -> None:
    url = f"s3://{BUCKET}/published-{uuid.uuid4().hex[:8]}"
    deployment = {
        **s3proxy_server.env,  # the AWS variables: credentials never in a setting
        "KIMI_BATCH_WAREHOUSE": url,
        "KIMI_BATCH_S3_ENDPOINT": s3proxy_server.endpoint,
        "KIMI_BATCH_S3_REGION": s3proxy_server.env["AWS_REGION"],
        "KIMI_BATCH_TRINO_HOST": trino_server.host,
        "KIMI_BATCH_TRINO_PORT": str(trino_server.port),
        "KIMI_BATCH_TRINO_SCHEMA": "objstore",
    }
    seen: list[tuple[list[str], list[str], list[str]]] = []
    with dg.instance_for_test() as instance, pytest.MonkeyPatch.context() as patch:
        for name, value in deployment.items():
            patch.setenv(name, value)
        settings = Settings.from_env()
        warehouse = open_warehouse(settings)
        instance.add_dynamic_partitions(SOURCE_PARTITIONS_NAME, ["lake"])
        # The seeds alone, then the whole batch (its generated tables too) replacing them.
        for ids, selection in ((["a", "b", "c"], ["seed_prompts"]), (["new-a", "new-b"], None)):
            _settled_inbox(llama_env, "lake", ids)
            result = dg.materialize(
                batch_assets(settings),
                selection=selection,
                partition_key=dg.MultiPartitionKey({"date": _today(), "source": "lake"}),
                resources=build_resources(settings),
                instance=instance,
                run_config=RUN_CONFIG if selection is None else None,
            )
            assert result.success
            published = [
                c
                for c in result.get_asset_check_evaluations()
                if c.check_name == "published_to_trino"
            ]
            assert len(published) == (1 if selection else 3)
            assert all(check.passed for check in published), published
            with TrinoPublisher(TrinoConfig.from_settings(settings)) as trino:
                rows = trino.query(
                    'SELECT input_id, "$path" FROM hive.objstore.seeds WHERE ds = ? ORDER BY 1',
                    [_today()],
                )
            read = warehouse.read_partition("seeds", _today(), "lake")["input_id"].sort()
            seen.append(([r[0] for r in rows], read.to_list(), [r[1] for r in rows]))
        with TrinoPublisher(TrinoConfig.from_settings(settings)) as trino:
            generated = {t: trino.count(t, _today(), "lake") for t in ("amplified", "distilled")}
            # `kimi-batch publish` registers every partition again at its current version.
            caught_up = trino.publish_all(warehouse)
            again = trino.count("seeds", _today(), "lake")

    (first_trino, first_read, first_paths), (trino_ids, read_ids, paths) = seen
    assert first_trino == first_read == ["a", "b", "c"]
    # Trino reads the files on the object store, at the partition's current version only.
    assert trino_ids == read_ids == ["new-a", "new-b"]
    assert all(path.startswith(f"{url}/seeds/ds={_today()}/source=lake/v") for path in paths)
    assert set(paths).isdisjoint(first_paths)
    assert caught_up.partitions_present >= 2  # seeds and quarantine (empty) of the partition
    assert again == 2
    # The generated tables landed on the object store too, and Trino reads them there.
    assert generated == {t: warehouse.count(t) for t in generated}
    assert generated["amplified"] > 0
    assert generated["distilled"] > 0


def _settled_inbox(env: LlamaEnv, source: str, ids: list[str]) -> None:
    """The inbox file of `source` with these rows, dated past the settle period."""
    path = env.home / "inbox" / f"{source}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"id": item, "prompt": f"Say {item}."}) for item in ids]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    settled = time.time() - 120
    os.utime(path, (settled, settled))
