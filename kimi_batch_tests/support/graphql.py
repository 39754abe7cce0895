"""A small client for dagster-webserver's /graphql endpoint: load, launch, wait, inspect runs."""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import Any

import dagster as dg
import httpx

__all__ = ["GraphQL"]

REPOSITORY_NAME = "__repository__"  # what a `Definitions` object is called in GraphQL
ASSET_JOB = "__ASSET_JOB"  # the implicit job of ad-hoc asset materializations
TERMINAL_STATUSES = frozenset({"SUCCESS", "FAILURE", "CANCELED"})
# Dagster's engine event when a run worker process starts.
_STARTED_PROCESS = re.compile(r"Started process for run \(pid: (\d+)\)")

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
          ... on TableSchemaMetadataEntry {
            schema { columns { name type constraints { nullable } } }
          }
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

_TERMINATE_RUN = """
mutation Terminate($runId: String!) {
  terminateRun(runId: $runId) {
    __typename
    ... on TerminateRunSuccess { run { runId status } }
    ... on TerminateRunFailure { message }
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

_POOL_QUERY = """
query Pool($pool: String!) {
  instance { concurrencyLimit(concurrencyKey: $pool) { claimedSlots { runId stepKey } } }
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

    def launch_dynamic_partition_run(self, job: str, key: str) -> str:
        """Queue a run of `job` for one partition of a single dynamic dimension."""
        tags = [{"key": "dagster/partition", "value": key}]
        return self._launch({**self.repository_selector, "jobName": job}, tags)

    def terminate_run(self, run_id: str) -> None:
        """What the UI's Terminate button does."""
        result = self.query(_TERMINATE_RUN, {"runId": run_id})["terminateRun"]
        if result["__typename"] != "TerminateRunSuccess":
            raise AssertionError(f"terminateRun failed: {result}")

    def launch_assets_run(
        self,
        keys: list[str],
        partition: dg.MultiPartitionKey | None = None,
        run_config: Mapping[str, Any] | None = None,
    ) -> str:
        """Queue a run of just these assets, as the UI's Materialize button does (no job tags)."""
        selector = {
            **self.repository_selector,
            "jobName": ASSET_JOB,
            "assetSelection": [{"path": key.split("/")} for key in keys],
        }
        tags = _partition_tags(partition) if partition else []
        return self._launch(selector, tags, run_config)

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

    def run_events(self, run_id: str) -> list[dict[str, Any]]:
        return self.query(_RUN_EVENTS_QUERY, {"runId": run_id})["logsForRun"].get("events", [])

    def run_worker_pid(self, run_id: str) -> int:
        """The pid of the run's worker process, from the launcher's "Started process" event."""
        for event in self.run_events(run_id):
            found = _STARTED_PROCESS.search(str(event.get("message") or ""))
            if found:
                return int(found.group(1))
        raise AssertionError(f"run {run_id} has no 'Started process for run' event")

    def pool_holders(self, pool: str) -> set[str]:
        """Ids of the runs holding a slot of the concurrency pool `pool` now."""
        limit = self.query(_POOL_QUERY, {"pool": pool})["instance"]["concurrencyLimit"]
        return {str(slot["runId"]) for slot in limit["claimedSlots"]}

    def run_errors(self, run_id: str) -> str:
        """Error messages of a run, for assertion messages."""
        events = self.run_events(run_id)
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
