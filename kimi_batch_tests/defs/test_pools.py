"""Server safety: the repo's dagster.yaml runs llama-server runs one at a time.

- The instance built from dagster.yaml has the queue, the `llama_server` pool limit (granularity
  `run`, default limit 1), run monitoring and SQLite storage under DAGSTER_HOME.
- Two partition runs queued together through a real webserver + daemon run one after the other
  and both succeed: with stand-in assets (no model; the pool mechanism alone), and with the real
  assets against the real llama-server, whose `/slots` and `/metrics` are sampled throughout to
  show it never had more requests in flight than slots.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dagster as dg
import httpx
import pytest

from kimi_batch.defs.assets.night import nightly_job
from kimi_batch.defs.jobs import LLAMA_TAG, batch_job, distillation_job, ingest_job
from kimi_batch.defs.partitions import DATE_DIMENSION, SOURCE_DIMENSION
from kimi_batch_tests.support.dagster_stack import DagsterStack
from kimi_batch_tests.support.graphql import GraphQL
from kimi_batch_tests.support.repo import REPO_ROOT
from kimi_batch_tests.support.standins import STANDIN_SLEEP_ENV

DAY = "2025-06-01"
RUN_TIMEOUT_S = 1500.0
# Short answers: the test is about who runs when, and 2 CPU cores are shared with other tests.
SHORT_ANSWERS = {
    "ops": {
        "amplified_prompts": {"config": {"max_tokens": 24}},
        "distilled_responses": {"config": {"max_tokens": 32}},
    }
}
_METRIC = re.compile(r"^llamacpp:(requests_processing|requests_deferred)\s+([0-9.eE+-]+)$", re.M)


def partition(source: str) -> dg.MultiPartitionKey:
    return dg.MultiPartitionKey({DATE_DIMENSION: DAY, SOURCE_DIMENSION: source})


def run_two_partitions_together(
    graphql: GraphQL,
    job: str,
    sources: tuple[str, str],
    *,
    timeout_s: float,
    run_config: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Queue `job` for two partitions back to back; both runs once ended, in start order."""
    for source in sources:
        graphql.add_dynamic_partition("source", source)
    run_ids = [
        graphql.launch_partition_run(job, partition(source), run_config) for source in sources
    ]
    runs = [graphql.wait_run(run_id, timeout_s) for run_id in run_ids]
    for run in runs:
        assert run["status"] == "SUCCESS", graphql.run_errors(run["runId"])
    return sorted(runs, key=lambda run: run["startTime"])


def assert_one_after_the_other(runs: list[dict[str, Any]]) -> None:
    first, second = runs
    assert first["endTime"] is not None
    assert second["startTime"] is not None
    assert first["endTime"] <= second["startTime"], (
        f"runs overlapped: first {first['startTime']:.1f}-{first['endTime']:.1f}, "
        f"second started {second['startTime']:.1f}"
    )


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


@pytest.fixture
def standin_stack(tmp_path: Path) -> Iterator[DagsterStack]:
    """Webserver + daemon over the stand-in location; llama steps sleep 3 s in the pool."""
    home = tmp_path / "kimi_home"
    for source in ("alpha", "beta", "gamma", "delta"):
        target = home / "inbox" / DAY / f"{source}.jsonl"
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


# ---- the real assets against the real server ---------------------------------------------------


@dataclass
class ServerSampler:
    """Polls llama-server's /slots and /metrics in a thread while the runs go on."""

    base_url: str
    headers: dict[str, str]
    interval_s: float = 0.2
    busy_slots: list[int] = field(default_factory=list)
    in_flight: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        with httpx.Client(base_url=self.base_url, headers=self.headers, timeout=5.0) as client:
            while not self._stop.is_set():
                try:
                    slots = client.get("/slots").json()
                    self.busy_slots.append(sum(1 for slot in slots if slot.get("is_processing")))
                    metrics = dict(_METRIC.findall(client.get("/metrics").text))
                    if metrics:
                        self.in_flight.append(
                            int(float(metrics.get("requests_processing", 0)))
                            + int(float(metrics.get("requests_deferred", 0)))
                        )
                except (httpx.HTTPError, ValueError) as error:
                    self.errors.append(repr(error))
                self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()


@pytest.fixture
def sampler(llama_env: Any) -> Iterator[ServerSampler]:
    key = os.environ.get("KIMI_BATCH_LLAMA_API_KEY")
    sampler = ServerSampler(
        base_url=llama_env.base_url, headers={"Authorization": f"Bearer {key}"} if key else {}
    )
    thread = threading.Thread(target=sampler.run, name="llama-sampler", daemon=True)
    thread.start()
    try:
        yield sampler
    finally:
        sampler.stop()
        thread.join(timeout=10)


@pytest.mark.slow
@pytest.mark.timeout(2 * RUN_TIMEOUT_S + 600)
def test_two_partition_runs_never_overload_the_server(
    llama_env: Any, sampler: ServerSampler, tmp_path: Path
) -> None:
    inbox = Path(llama_env.home) / "inbox" / DAY
    inbox.mkdir(parents=True, exist_ok=True)
    sources = ("pool_a", "pool_b")
    for index, source in enumerate(sources):
        (inbox / f"{source}.jsonl").write_text(
            f'{{"id": "{source}-1", "prompt": "Name a color number {index}."}}\n'
            f'{{"id": "{source}-2", "prompt": "What is {index} plus two?"}}\n'
        )

    with DagsterStack(
        tmp_path / "dagster_home", workspace=REPO_ROOT / "workspace.yaml", location="kimi_batch"
    ) as stack:
        try:
            runs = run_two_partitions_together(
                stack.graphql,
                "batch_job",
                sources,
                timeout_s=RUN_TIMEOUT_S,
                run_config=SHORT_ANSWERS,
            )
        except (AssertionError, TimeoutError) as error:
            raise AssertionError(f"{error}\n{stack.logs()}") from error

    assert_one_after_the_other(runs)
    slots = int(llama_env.slots)
    for run in runs:  # the engine's own count agrees with what the server showed
        for materialization in run["assetMaterializations"]:
            for entry in materialization["metadataEntries"]:
                if entry["label"] == "max_in_flight":
                    assert entry["intValue"] <= slots, materialization
    assert sampler.busy_slots, f"no /slots sample: {sampler.errors[-3:]}"
    assert max(sampler.busy_slots) >= 1, "the sampler never saw the server working"
    assert max(sampler.busy_slots) <= slots
    if sampler.in_flight:  # needs --metrics; requests waiting for a slot count as in flight
        assert max(sampler.in_flight) <= slots, (
            f"{max(sampler.in_flight)} requests in flight on {slots} slots"
        )
