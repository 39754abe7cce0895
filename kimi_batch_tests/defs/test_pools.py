"""Server safety: the repo's dagster.yaml runs llama-server runs one at a time.

- The instance built from dagster.yaml has the queue, the `llama_server` pool limit (granularity
  `op`, default limit 1), run monitoring and SQLite storage under DAGSTER_HOME.
- Two partition runs queued together through a real webserver + daemon run one after the other
  and both succeed, with stand-in assets (no model; the pool mechanism alone). The same with the
  real assets against the real llama-server is in test_webserver.py, on its stack.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from kimi_batch.defs.assets.night import nightly_job
from kimi_batch.defs.jobs import LLAMA_TAG, batch_job, distillation_job, ingest_job
from kimi_batch_tests.support.dagster_stack import DagsterStack
from kimi_batch_tests.support.pool_runs import (
    POOL_DAY,
    assert_one_after_the_other,
    partition,
    run_two_partitions_together,
)
from kimi_batch_tests.support.repo import REPO_ROOT
from kimi_batch_tests.support.standins import STANDIN_SLEEP_ENV

# Its slow tests start no llama-server: they run beside the ones that do (support/slow_split.py).
pytestmark = pytest.mark.no_llama_server

# ---- the configuration itself ------------------------------------------------------------------


def test_repo_dagster_yaml_queues_runs_and_limits_the_llama_pool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO_ROOT / "dagster.yaml").read_text())
    monkeypatch.setenv("DAGSTER_HOME", str(home))

    with dg.DagsterInstance.get() as instance:
        concurrency = instance.get_concurrency_config()
        pool = concurrency.pool_config
        queue = concurrency.run_queue_config
        assert type(instance.run_coordinator).__name__ == "QueuedRunCoordinator"
        assert pool.pool_granularity is not None
        assert pool.pool_granularity.value == "op"
        assert pool.default_pool_limit == 1
        assert queue is not None
        assert queue.max_concurrent_runs == 4
        assert queue.should_block_op_concurrency_limited_runs
        assert [
            (limit["key"], limit.get("value"), limit["limit"])
            for limit in queue.tag_concurrency_limits
        ] == [(LLAMA_TAG, "true", 1)]
        assert instance.run_monitoring_enabled
        assert instance.run_monitoring_start_timeout_seconds == 300
        # A run killed hard holds its `llama_server` slot until the daemon frees it: seconds
        # after its end, not minutes (the full-stack kill test measures it on a real daemon).
        monitoring = instance.run_monitoring_settings
        assert (
            monitoring["poll_interval_seconds"] + monitoring["free_slots_after_run_end_seconds"]
            <= 30
        )
        assert instance.is_persistent
        assert not instance.telemetry_enabled
        # Storage resolves from DAGSTER_HOME: the databases appear under this home.
        assert (home / "history" / "runs.db").exists()
        assert (home / "schedules").is_dir()


def test_every_job_carries_the_llama_tag() -> None:
    for job in (batch_job, ingest_job, distillation_job, nightly_job):
        assert job.tags is not None
        assert job.tags[LLAMA_TAG] == "true"


def test_workspace_yaml_loads_the_kimi_batch_module() -> None:
    text = (REPO_ROOT / "workspace.yaml").read_text()
    assert "module_name: kimi_batch.definitions" in text
    assert "location_name: kimi_batch" in text
    assert "working_directory: ." in text


# ---- stand-in assets: the pool mechanism alone -------------------------------------------------


@pytest.fixture(scope="module")
def standin_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DagsterStack]:
    """Webserver + daemon over the stand-in location; llama steps sleep 3 s in the pool.

    One stack for the module's tests: each queues runs of its own partitions and waits for
    those runs only, so they do not see each other.
    """
    tmp_path = tmp_path_factory.mktemp("standin_stack")
    home = tmp_path / "kimi_home"
    for source in ("alpha", "beta", "gamma", "delta"):
        target = home / "inbox" / POOL_DAY / f"{source}.jsonl"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text('{"prompt": "hi"}\n')
    workspace = tmp_path / "workspace.yaml"
    workspace.write_text(
        "load_from:\n"
        "  - python_module:\n"
        "      module_name: kimi_batch_tests.support.standins\n"
        "      attribute: STANDIN_DEFS\n"
        f"      working_directory: {REPO_ROOT}\n"
        "      location_name: standin\n"
    )
    env = {"KIMI_BATCH_HOME": str(home), STANDIN_SLEEP_ENV: "3"}
    with DagsterStack(
        tmp_path / "dagster_home", workspace=workspace, location="standin", env=env
    ) as stack:
        yield stack


@pytest.mark.slow
def test_job_runs_queued_together_run_one_after_the_other(standin_stack: DagsterStack) -> None:
    try:
        runs = run_two_partitions_together(
            standin_stack.graphql, "batch_job", ("alpha", "beta"), timeout_s=300
        )
    except (AssertionError, TimeoutError) as error:
        raise AssertionError(f"{error}\n{standin_stack.logs()}") from error

    assert_one_after_the_other(runs)


@pytest.mark.slow
def test_untagged_asset_runs_still_take_turns_on_the_pool(standin_stack: DagsterStack) -> None:
    # Two UI-style materializations of the pooled asset: no job tag, so the queue lets both
    # start; the pool makes the llama steps themselves take turns.
    graphql = standin_stack.graphql
    for source in ("gamma", "delta"):
        graphql.add_dynamic_partition("source", source)
    run_ids = [
        graphql.launch_assets_run(["amplified_prompts"], partition(source))
        for source in ("gamma", "delta")
    ]
    windows: list[tuple[float, float]] = []
    for run_id in run_ids:
        run = graphql.wait_run(run_id, 300)
        assert run["status"] == "SUCCESS", f"{graphql.run_errors(run_id)}\n{standin_stack.logs()}"
        (materialization,) = run["assetMaterializations"]
        values = {e["label"]: e.get("floatValue") for e in materialization["metadataEntries"]}
        windows.append((float(values["started"]), float(values["ended"])))

    (_, first_end), (second_start, _) = sorted(windows)
    assert first_end <= second_start, f"pooled steps overlapped: {sorted(windows)}"
