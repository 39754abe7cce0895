"""Tests of kimi_batch.defs, and what they share.

- `standin_definitions()`: the real jobs, sensor and schedule over small stand-in assets with the
  real keys and partitions. Asset jobs are defined by key and need assets to resolve; the
  sensor/schedule tests test orchestration, not generation, so the stand-ins only find their
  inbox file (through the real `resolve_source_file`) and sleep a little in the llama pool.
  `STANDIN_DEFS` is the same thing as a code location (`kimi_batch_tests.defs:STANDIN_DEFS`).
- `DagsterStack`: a real `dagster-webserver` on a free loopback port plus `dagster-daemon` (it
  dequeues runs: every run goes through the queue of dagster.yaml), in their own process group,
  killed on exit; `GraphQL` talks to the webserver.

No `from __future__ import annotations` here: Dagster inspects the stand-in assets' `context`
annotation when they are defined and rejects it as a string.
"""

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import dagster as dg
import httpx

from kimi_batch.defs.jobs import batch_job, distillation_job, ingest_job
from kimi_batch.defs.partitions import batch_partitions, partition_parts
from kimi_batch.defs.schedules import nightly_distillation_schedule
from kimi_batch.defs.sensors import inbox_sensor
from kimi_batch.settings import Settings
from kimi_batch.storage.landing import resolve_partition

__all__ = [
    "REPO_ROOT",
    "STANDIN_DEFS",
    "STANDIN_SLEEP_ENV",
    "DagsterStack",
    "GraphQL",
    "free_port",
    "standin_definitions",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
REPOSITORY_NAME = "__repository__"  # what a `Definitions` object is called in GraphQL
ASSET_JOB = "__ASSET_JOB"  # the implicit job of ad-hoc asset materializations
STANDIN_SLEEP_ENV = "KIMI_BATCH_TEST_STANDIN_SLEEP"
TERMINAL_STATUSES = frozenset({"SUCCESS", "FAILURE", "CANCELED"})

_RUN_QUERY = """
query Run($runId: ID!) {
  runOrError(runId: $runId) {
    __typename
    ... on Run {
      runId status startTime endTime tags { key value }
      assetMaterializations {
        assetKey { path }
        partition
        metadataEntries {
          label __typename
          ... on IntMetadataEntry { intValue }
          ... on FloatMetadataEntry { floatValue }
          ... on TextMetadataEntry { text }
        }
      }
    }
    ... on Error { message }
  }
}
"""

_RUN_EVENTS_QUERY = """
query Events($runId: ID!) {
  logsForRun(runId: $runId, limit: 2000) {
    __typename
    ... on EventConnection {
      events {
        __typename
        ... on MessageEvent { message level }
        ... on ExecutionStepFailureEvent { error { message stack } }
        ... on RunFailureEvent { error { message } }
      }
    }
  }
}
"""

_LAUNCH_RUN = """
mutation Launch($executionParams: ExecutionParams!) {
  launchRun(executionParams: $executionParams) {
    __typename
    ... on LaunchRunSuccess { run { runId status } }
    ... on RunConfigValidationInvalid { errors { message } }
    ... on Error { message }
  }
}
"""

_ADD_PARTITION = """
mutation Add($selector: RepositorySelector!, $name: String!, $key: String!) {
  addDynamicPartition(repositorySelector: $selector, partitionsDefName: $name, partitionKey: $key) {
    __typename
    ... on AddDynamicPartitionSuccess { partitionKey }
    ... on Error { message }
  }
}
"""

_ASSET_NODES_QUERY = """
{
  assetNodes {
    assetKey { path }
    isPartitioned isMaterializable jobNames pools
    partitionDefinition { type dimensionTypes { name type dynamicPartitionsDefinitionName } }
  }
}
"""

_INSTIGATORS_QUERY = """
query Instigators($selector: RepositorySelector!) {
  schedulesOrError(repositorySelector: $selector) {
    __typename
    ... on Schedules {
      results {
        name cronSchedule executionTimezone pipelineName description
        scheduleState { status }
      }
    }
    ... on Error { message }
  }
  sensorsOrError(repositorySelector: $selector) {
    __typename
    ... on Sensors {
      results {
        name minIntervalSeconds description
        targets { pipelineName }
        sensorState { status }
      }
    }
    ... on Error { message }
  }
}
"""

_WORKSPACE_QUERY = """
{
  workspaceOrError {
    __typename
    ... on Workspace {
      locationEntries {
        name loadStatus
        locationOrLoadError { __typename ... on PythonError { message stack } }
      }
    }
  }
}
"""


# ---- stand-in definitions ----------------------------------------------------------------------


def _standin_sleep() -> float:
    return float(os.environ.get(STANDIN_SLEEP_ENV, "0"))


def standin_definitions() -> dg.Definitions:
    """The real jobs/sensor/schedule over stand-in assets with the real keys and partitions."""

    @dg.asset(name="seed_prompts", partitions_def=batch_partitions)
    def seed_prompts(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        ds, source = partition_parts(context)
        resolved = resolve_partition(Settings.from_env(), ds, source)
        version = resolved.version
        return dg.MaterializeResult(
            metadata={
                "file": resolved.assignment.name,
                "bytes": version.size if version else -1,
                "problem": resolved.problem or "",
            }
        )

    @dg.asset(
        name="amplified_prompts",
        partitions_def=batch_partitions,
        deps=[seed_prompts],
        pool="llama_server",
    )
    def amplified_prompts() -> dg.MaterializeResult:
        return _pooled_step()

    @dg.asset(
        name="distilled_responses",
        partitions_def=batch_partitions,
        deps=[amplified_prompts],
        pool="llama_server",
    )
    def distilled_responses() -> dg.MaterializeResult:
        return _pooled_step()

    return dg.Definitions(
        assets=[seed_prompts, amplified_prompts, distilled_responses],
        jobs=[batch_job, ingest_job, distillation_job],
        sensors=[inbox_sensor],
        schedules=[nightly_distillation_schedule],
    )


def _pooled_step() -> dg.MaterializeResult:
    started = time.time()
    time.sleep(_standin_sleep())
    return dg.MaterializeResult(metadata={"started": started, "ended": time.time()})


STANDIN_DEFS = standin_definitions()


# ---- webserver + daemon ------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class GraphQL:
    """A small client for the webserver's /graphql endpoint; raises on transport/query errors."""

    def __init__(self, base_url: str, *, location: str) -> None:
        self._client = httpx.Client(base_url=base_url, timeout=60.0)
        self.location = location

    def close(self) -> None:
        self._client.close()

    @property
    def repository_selector(self) -> dict[str, str]:
        return {"repositoryLocationName": self.location, "repositoryName": REPOSITORY_NAME}

    def query(self, query: str, variables: Mapping[str, Any] | None = None) -> dict[str, Any]:
        response = self._client.post(
            "/graphql", json={"query": query, "variables": dict(variables or {})}
        )
        response.raise_for_status()
        body = response.json()
        if body.get("errors"):
            raise AssertionError(f"GraphQL errors: {body['errors']}")
        return body["data"]

    def wait_loaded(self, timeout_s: float) -> None:
        """Wait until the code location is loaded; fail with its load error if it has one."""
        deadline = time.monotonic() + timeout_s
        last: object = None
        while time.monotonic() < deadline:
            try:
                data = self.query(_WORKSPACE_QUERY)["workspaceOrError"]
            except httpx.HTTPError as error:
                last = error
            else:
                last = data
                for entry in data.get("locationEntries", []):
                    if entry["name"] != self.location or entry["loadStatus"] != "LOADED":
                        continue
                    loaded = entry["locationOrLoadError"] or {}
                    if loaded.get("__typename") == "PythonError":
                        raise AssertionError(f"code location failed to load: {loaded}")
                    return
            time.sleep(1.0)
        raise TimeoutError(f"code location {self.location} not loaded in {timeout_s}s: {last}")

    def asset_nodes(self) -> dict[str, dict[str, Any]]:
        """Asset nodes by `/`-joined key."""
        nodes = self.query(_ASSET_NODES_QUERY)["assetNodes"]
        return {"/".join(node["assetKey"]["path"]): node for node in nodes}

    def instigators(self) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
        """(schedules by name, sensors by name) of the code location."""
        data = self.query(_INSTIGATORS_QUERY, {"selector": self.repository_selector})
        found: list[dict[str, dict[str, Any]]] = []
        for field in ("schedulesOrError", "sensorsOrError"):
            if "results" not in data[field]:
                raise AssertionError(f"{field}: {data[field]}")
            found.append({item["name"]: item for item in data[field]["results"]})
        return found[0], found[1]

    def add_dynamic_partition(self, name: str, key: str) -> None:
        result = self.query(
            _ADD_PARTITION, {"selector": self.repository_selector, "name": name, "key": key}
        )["addDynamicPartition"]
        # Adding one that exists is an error type; both leave the partition there.
        if result["__typename"] != "AddDynamicPartitionSuccess" and "already" not in str(
            result.get("message", "")
        ):
            raise AssertionError(f"addDynamicPartition failed: {result}")

    def launch_partition_run(
        self,
        job: str,
        partition: dg.MultiPartitionKey,
        run_config: Mapping[str, Any] | None = None,
    ) -> str:
        """Queue a run of `job` for one date|source partition; returns its run id."""
        return self._launch(
            {**self.repository_selector, "jobName": job}, _partition_tags(partition), run_config
        )

    def launch_assets_run(
        self, keys: list[str], partition: dg.MultiPartitionKey | None = None
    ) -> str:
        """Queue a run of just these assets, as the UI's Materialize button does (no job tags)."""
        selector = {
            **self.repository_selector,
            "jobName": ASSET_JOB,
            "assetSelection": [{"path": key.split("/")} for key in keys],
        }
        return self._launch(selector, _partition_tags(partition) if partition else [])

    def _launch(
        self,
        selector: dict[str, Any],
        tags: list[dict[str, str]],
        run_config: Mapping[str, Any] | None = None,
    ) -> str:
        params = {
            "selector": selector,
            "runConfigData": dict(run_config or {}),
            "executionMetadata": {"tags": tags},
        }
        result = self.query(_LAUNCH_RUN, {"executionParams": params})["launchRun"]
        if result["__typename"] != "LaunchRunSuccess":
            raise AssertionError(f"launchRun failed: {result}")
        return str(result["run"]["runId"])

    def run(self, run_id: str) -> dict[str, Any]:
        result = self.query(_RUN_QUERY, {"runId": run_id})["runOrError"]
        if result["__typename"] != "Run":
            raise AssertionError(f"no run {run_id}: {result}")
        return result

    def wait_run(self, run_id: str, timeout_s: float) -> dict[str, Any]:
        """Poll until the run ends; the run (status, times, materializations)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            run = self.run(run_id)
            if run["status"] in TERMINAL_STATUSES:
                return run
            time.sleep(1.0)
        raise TimeoutError(f"run {run_id} still {self.run(run_id)['status']} after {timeout_s}s")

    def run_errors(self, run_id: str) -> str:
        """Error messages of a run, for assertion messages."""
        events = self.query(_RUN_EVENTS_QUERY, {"runId": run_id})["logsForRun"].get("events", [])
        lines = [
            str(event.get("error") or event.get("message"))
            for event in events
            if event.get("error") or event.get("level") in ("ERROR", "CRITICAL")
        ]
        return "\n".join(lines[-10:]) or "(no error events)"


def _partition_tags(partition: dg.MultiPartitionKey) -> list[dict[str, str]]:
    return [{"key": "dagster/partition", "value": str(partition)}] + [
        {"key": f"dagster/partition/{dim}", "value": value}
        for dim, value in partition.keys_by_dimension.items()
    ]


class DagsterStack:
    """`dagster-webserver` + `dagster-daemon` on a temporary DAGSTER_HOME with the repo's
    dagster.yaml, serving one code location; both are stopped (process group) on exit.
    """

    def __init__(
        self,
        dagster_home: Path,
        *,
        workspace: Path,
        location: str,
        env: Mapping[str, str] | None = None,
        startup_timeout_s: float = 240.0,
    ) -> None:
        self.dagster_home = dagster_home
        self.workspace = workspace
        self.location = location
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._env = {**os.environ, **(env or {}), "DAGSTER_HOME": str(dagster_home)}
        self._startup_timeout_s = startup_timeout_s
        self._processes: list[tuple[subprocess.Popen[bytes], Path]] = []
        self.graphql = GraphQL(self.base_url, location=location)

    def __enter__(self) -> Self:
        self.dagster_home.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO_ROOT / "dagster.yaml", self.dagster_home / "dagster.yaml")
        bin_dir = Path(sys.executable).parent
        # Create the SQLite databases once, before four processes (webserver, daemon and their
        # code servers) race to create them: concurrent first stamps corrupt alembic's table.
        subprocess.run(
            [str(bin_dir / "dagster"), "instance", "migrate"],
            env=self._env,
            cwd=self.workspace.parent,
            check=True,
            capture_output=True,
            timeout=self._startup_timeout_s,
        )
        try:
            self._spawn(
                "webserver",
                [
                    str(bin_dir / "dagster-webserver"),
                    *("-h", "127.0.0.1", "-p", str(self.port)),
                    *("-w", str(self.workspace)),
                ],
            )
            self._spawn(
                "daemon", [str(bin_dir / "dagster-daemon"), "run", "-w", str(self.workspace)]
            )
            self._wait_http()
            self.graphql.wait_loaded(self._startup_timeout_s)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.graphql.close()
        for process, _ in reversed(self._processes):
            _stop_group(process)
        self._processes.clear()

    def logs(self) -> str:
        """The last lines of each process's output, for assertion messages."""
        parts = []
        for process, log in self._processes:
            text = log.read_text(errors="replace") if log.exists() else ""
            parts.append(f"--- {log.name} (pid {process.pid}) ---\n" + text[-4000:])
        return "\n".join(parts)

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = self.dagster_home / f"{name}.log"
        with log.open("wb") as out:
            # Own session: the code servers and run workers they start share its process group,
            # so one killpg stops the whole tree and nothing outlives the test.
            process = subprocess.Popen(
                argv,
                cwd=self.workspace.parent,
                env=self._env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._processes.append((process, log))

    def _wait_http(self) -> None:
        deadline = time.monotonic() + self._startup_timeout_s
        while time.monotonic() < deadline:
            for process, log in self._processes:
                if process.poll() is not None:
                    raise AssertionError(
                        f"{log.name} exited with {process.returncode}:\n{self.logs()}"
                    )
            try:
                if httpx.get(f"{self.base_url}/server_info", timeout=5.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"webserver not up in {self._startup_timeout_s}s:\n{self.logs()}")


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group we created for `process`, SIGKILL what is left after 30 s."""
    try:
        pgid = os.getpgid(process.pid)
    except ProcessLookupError:
        process.wait()
        return
    for sig, wait_s in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        try:
            process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
        # The leader is gone; give the rest of the group a moment, then make sure.
        time.sleep(0.5)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        break
    if process.poll() is None:
        process.wait(timeout=10.0)
