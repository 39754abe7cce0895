"""The one Definitions object loads, validates, and draws the graph the UI shows."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from kimi_batch.definitions import defs
from kimi_batch_tests.support.repo import REPO_ROOT


@pytest.mark.slow
def test_dagster_cli_validates_the_workspace_on_the_repo_instance_config(tmp_path: Path) -> None:
    shutil.copy(REPO_ROOT / "dagster.yaml", tmp_path / "dagster.yaml")
    dagster = Path(sys.executable).with_name("dagster")
    result = subprocess.run(
        [str(dagster), "definitions", "validate", "-w", "workspace.yaml"],
        cwd=REPO_ROOT,
        env={**os.environ, "DAGSTER_HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]


def test_asset_graph_reads_digest_then_seed_amplified_distilled() -> None:
    graph = defs.resolve_asset_graph()
    key = dg.AssetKey
    assert graph.get(key("digest_prefill")).parent_keys == {key("system_digest")}
    assert graph.get(key("amplified_prompts")).parent_keys == {key("seed_prompts")}
    assert graph.get(key("distilled_responses")).parent_keys == {
        key("seed_prompts"),
        key("amplified_prompts"),
    }
    assert defs.resolve_job_def("batch_job") is not None
    assert {s.name for s in defs.schedules or []} == {"nightly_distillation_schedule"}
    assert {s.name for s in defs.sensors or []} == {
        "inbox_sensor",
        "api_batch_sensor",
        "run_failure_alert",
        "distilled_freshness_alert",
        "trino_catch_up",
    }


def test_every_asset_has_a_description_and_a_group() -> None:
    for spec in defs.resolve_all_asset_specs():
        assert spec.description, spec.key
        assert spec.group_name in {"digest", "batch", "api"}, spec.key


def test_a_batch_api_batch_is_its_own_partition_with_no_amplification() -> None:
    graph = defs.resolve_asset_graph()
    node = graph.get(dg.AssetKey("api_batch_responses"))
    assert node.parent_keys == set()
    assert isinstance(node.partitions_def, dg.DynamicPartitionsDefinition)
    assert node.partitions_def.name == "api_batch"
    job = defs.resolve_job_def("api_batch_job")
    assert job.tags["kimi_batch/uses_llama_server"] == "true"
