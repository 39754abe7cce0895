"""How many of the project's modules one `distilled_responses` partition runs when it is
materialized (its upstream already built): the asset, the driver, the engine's batch, the landing
(issue 46: a feature is one package, so a partition's walk crosses few of them). `engine/` and
`llama/` are not counted."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

import dagster as dg
import pytest

from kimi_batch.definitions import batch_assets, build_resources
from kimi_batch.defs.partitions import SOURCE_PARTITIONS_NAME
from kimi_batch.settings import Settings
from kimi_batch_tests.support.llama_server import LlamaEnv
from kimi_batch_tests.support.module_trace import traced

pytestmark = pytest.mark.slow  # the partition is answered by a real llama-server

# Measured when this test was written: 46 modules in 10 packages; 27 in 9 once defs/, pipeline/,
# inputs/, settings/ and storage/ kept one module per concept (the resources, the step's run,
# what Dagster records; the driver with its lease, landed with its sink and checks...); 26 once
# the state database picked its own backend; 17 once the modules that were one concept became
# one (defs/'s stage asset with its driver and landing, and its partition's parts; the pipeline's
# driver with its landing; the warehouse's catalog, overwrite and tables; the state database with
# its SQLite backend; the quality gate with its benchmarks, the dedup index with its text keys);
# 16 once the deployment's server as a run uses it moved from pipeline/ to engine/ (it runs the
# engine against the server, and imports nothing of the pipeline).
# A ratchet, so the walk only gets shorter from here; the goal is at most 10 modules.
MAX_MODULES = 16


# Small answers: what is counted is which modules run, not how long.
SMALL_RUN = {
    "amplified_prompts": {"config": {"strategies": ["paraphrase"], "max_tokens": 32}},
    "distilled_responses": {"config": {"max_tokens": 48}},
}


def _materialize(
    instance: dg.DagsterInstance,
    assets: Sequence[dg.AssetsDefinition],
    resources: Mapping[str, object],
    key: dg.MultiPartitionKey,
    selection: list[str],
) -> dg.ExecuteInProcessResult:
    return dg.materialize(
        assets,
        selection=selection,
        partition_key=key,
        resources=resources,
        instance=instance,
        run_config={"ops": {op: SMALL_RUN[op] for op in selection if op in SMALL_RUN}},
    )


def test_one_distilled_partition_runs_few_modules(llama_env: LlamaEnv) -> None:
    inbox = llama_env.home / "inbox"
    inbox.mkdir(parents=True, exist_ok=True)
    (inbox / "trace.jsonl").write_text('{"prompt": "Name a colour."}\n', encoding="utf-8")
    key = dg.MultiPartitionKey({"date": datetime.now(UTC).date().isoformat(), "source": "trace"})
    # The definitions are built ahead: building them is not the partition's walk.
    settings = Settings.from_env()
    assets, resources = batch_assets(settings), build_resources(settings)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(SOURCE_PARTITIONS_NAME, ["trace"])
        upstream = _materialize(
            instance, assets, resources, key, ["seed_prompts", "amplified_prompts"]
        )
        assert upstream.success
        with traced() as trace:
            result = _materialize(instance, assets, resources, key, ["distilled_responses"])
        assert result.success
        (materialization,) = result.asset_materializations_for_node("distilled_responses")
    rows = materialization.metadata["rows"].value
    assert isinstance(rows, int)
    assert rows >= 1

    print(trace.report())
    assert len(trace.modules) <= MAX_MODULES, trace.modules
