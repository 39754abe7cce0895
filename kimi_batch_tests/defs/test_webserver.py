"""The real code location on a real webserver + daemon, driven only through the GraphQL API.

The webserver listens on a free 127.0.0.1 port with a temporary DAGSTER_HOME holding the repo's
dagster.yaml (runs are queued, so the daemon runs too) and loads workspace.yaml. The test reads
the asset graph, the schedule and the sensor, launches one date|source partition of `batch_job`
as the UI does, and waits for the run to succeed against the session's real llama-server.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from kimi_batch.defs.jobs import NIGHTLY_JOB_NAME
from kimi_batch.defs.partitions import DATE_DIMENSION, SOURCE_DIMENSION
from kimi_batch_tests.support.dagster_stack import DagsterStack
from kimi_batch_tests.support.repo import REPO_ROOT

pytestmark = pytest.mark.slow

DAY = "2025-06-01"
SOURCE = "webtest"
PARTITION = dg.MultiPartitionKey({DATE_DIMENSION: DAY, SOURCE_DIMENSION: SOURCE})
PROMPTS = [
    {"id": "web-1", "prompt": "Name one primary color."},
    {"id": "web-2", "prompt": "What is two plus two?"},
]
BATCH_ASSETS = ("seed_prompts", "amplified_prompts", "distilled_responses")
DIGEST_ASSETS = ("system_digest", "digest_prefill")
RUN_TIMEOUT_S = 1500.0
# Short answers: the test is about what the UI's backend shows and runs, not about the answers.
SHORT_ANSWERS = {
    "ops": {
        "amplified_prompts": {"config": {"max_tokens": 24}},
        "distilled_responses": {"config": {"max_tokens": 32}},
    }
}


def metadata(materialization: dict[str, Any]) -> dict[str, Any]:
    """Label → value of a materialization's int/float/text metadata entries."""
    values: dict[str, Any] = {}
    for entry in materialization["metadataEntries"]:
        for field in ("intValue", "floatValue", "text"):
            if field in entry:
                values[entry["label"]] = entry[field]
    return values


@pytest.mark.timeout(2 * RUN_TIMEOUT_S + 600)
def test_webserver_serves_the_graph_and_runs_a_partition(llama_env: Any, tmp_path: Path) -> None:
    inbox = Path(llama_env.home) / "inbox" / DAY
    inbox.mkdir(parents=True, exist_ok=True)
    (inbox / f"{SOURCE}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in PROMPTS))

    with DagsterStack(
        tmp_path / "dagster_home", workspace=REPO_ROOT / "workspace.yaml", location="kimi_batch"
    ) as stack:
        graphql = stack.graphql
        try:
            # The asset graph: every asset, the batch ones partitioned by date x source.
            nodes = graphql.asset_nodes()
            assert set(BATCH_ASSETS + DIGEST_ASSETS) <= set(nodes)
            for key in BATCH_ASSETS:
                node = nodes[key]
                assert node["isPartitioned"]
                dims = {d["name"]: d for d in node["partitionDefinition"]["dimensionTypes"]}
                assert set(dims) == {DATE_DIMENSION, SOURCE_DIMENSION}
                assert dims[SOURCE_DIMENSION]["dynamicPartitionsDefinitionName"] == "source"
            for key in ("amplified_prompts", "distilled_responses", "digest_prefill"):
                assert nodes[key]["pools"] == ["llama_server"], key
            assert {"batch_job", "distillation_job"} <= set(
                nodes["distilled_responses"]["jobNames"]
            )
            assert {"batch_job", "ingest_job"} <= set(nodes["amplified_prompts"]["jobNames"])

            # The schedule and the sensor, as the UI lists them.
            schedules, sensors = graphql.instigators()
            nightly = schedules["nightly_distillation_schedule"]
            # One run a night over all its partitions (distillation_job stays for one).
            assert nightly["pipelineName"] == NIGHTLY_JOB_NAME
            assert nightly["cronSchedule"] == "0 2 * * *"
            assert nightly["executionTimezone"] == "UTC"
            assert nightly["description"]
            inbox_sensor = sensors["inbox_sensor"]
            assert [t["pipelineName"] for t in inbox_sensor["targets"]] == ["ingest_job"]
            assert inbox_sensor["minIntervalSeconds"] == 30
            assert inbox_sensor["description"]

            # The digest first, as a user would (its prefill warms every slot), then the batch.
            digest = [key for key in DIGEST_ASSETS if nodes[key]["isMaterializable"]]
            if digest:
                digest_run = graphql.wait_run(graphql.launch_assets_run(digest), RUN_TIMEOUT_S)
                assert digest_run["status"] == "SUCCESS", graphql.run_errors(digest_run["runId"])

            graphql.add_dynamic_partition("source", SOURCE)
            run_id = graphql.launch_partition_run("batch_job", PARTITION, SHORT_ANSWERS)
            run = graphql.wait_run(run_id, RUN_TIMEOUT_S)
            assert run["status"] == "SUCCESS", graphql.run_errors(run_id)
        except (AssertionError, TimeoutError) as error:
            raise AssertionError(f"{error}\n{stack.logs()}") from error

    tags = {tag["key"]: tag["value"] for tag in run["tags"]}
    assert tags["dagster/partition"] == str(PARTITION)
    assert tags["kimi_batch/job"] == "batch"
    by_asset = {"/".join(m["assetKey"]["path"]): m for m in run["assetMaterializations"]}
    assert set(by_asset) == set(BATCH_ASSETS)
    for key, materialization in by_asset.items():
        assert materialization["partition"] == str(PARTITION), key
        assert metadata(materialization)["rows"] >= 1, (key, metadata(materialization))
    assert metadata(by_asset["seed_prompts"])["rows"] == len(PROMPTS)
    for key in ("amplified_prompts", "distilled_responses"):
        values = metadata(by_asset[key])
        assert values["completion_tokens"] > 0, (key, values)
        assert values["max_in_flight"] <= llama_env.slots, (key, values)
