"""The real code location on a real webserver + daemon: through GraphQL, through the browser, and
two partition runs against the `llama_server` pool.

The session's stack (`kimi_batch_stack`: webserver + daemon + their code servers over
workspace.yaml, a temporary DAGSTER_HOME holding the repo's dagster.yaml, so runs are queued)
serves the module's tests against the session's real llama-server, as it serves the Batch API's
full-stack tests. Each test has its own partitions and reads only its own runs, so each also
passes alone.

- GraphQL: the asset graph, the schedule and the sensor as the UI lists them, then one
  date|source partition of `batch_job` launched as the UI does.
- The browser (Playwright on Debian's chromium, `support/browser.py`): the upstream of one
  partition launched through GraphQL; then, as a user would: open the asset graph, open
  `distilled_responses`, press Materialize, pick the partition in the launch dialog, launch it,
  watch the run until it says Success, and read the partition's metadata and checks on the asset
  page. Screenshots are kept under var/test-artifacts/browser/ (the paths are printed).
- The pool: two partition runs queued together run one after the other, and llama-server's
  `/slots` and `/metrics`, sampled throughout, never show more requests in flight than slots.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Page, expect

from kimi_batch.defs.jobs import NIGHTLY_JOB_NAME
from kimi_batch.defs.partitions import DATE_DIMENSION, SOURCE_DIMENSION
from kimi_batch.warehouse import trino_columns
from kimi_batch_tests.support.browser import chromium, dismiss_welcome, screenshot
from kimi_batch_tests.support.dagster_stack import DagsterStack
from kimi_batch_tests.support.kimi_batch_stack import KimiBatchStack
from kimi_batch_tests.support.llama_server import LlamaEnv
from kimi_batch_tests.support.pool_runs import (
    POOL_DAY,
    assert_one_after_the_other,
    run_two_partitions_together,
)
from kimi_batch_tests.support.repo import REPO_ROOT
from kimi_batch_tests.support.server_sampler import ServerSampler, sampling

pytestmark = pytest.mark.slow

BATCH_ASSETS = ("seed_prompts", "amplified_prompts", "distilled_responses")
DIGEST_ASSETS = ("system_digest", "digest_prefill")
RUN_TIMEOUT_S = 1500.0
# Short answers: the tests are about what the UI's backend shows and runs and who runs when, not
# about the answers.
SHORT_ANSWERS = {
    "ops": {
        "amplified_prompts": {"config": {"max_tokens": 24}},
        "distilled_responses": {"config": {"max_tokens": 32}},
    }
}


@pytest.fixture(scope="module")
def stack(kimi_batch_stack: KimiBatchStack) -> DagsterStack:
    """The real code location on the session's webserver + daemon."""
    return kimi_batch_stack.dagster


@pytest.fixture(scope="module")
def digest_run(stack: DagsterStack) -> dict[str, Any]:
    """The digest materialized as a user would first (its prefill warms every slot), once."""
    graphql = stack.graphql
    run = graphql.wait_run(graphql.launch_assets_run(list(DIGEST_ASSETS)), RUN_TIMEOUT_S)
    assert run["status"] == "SUCCESS", f"{graphql.run_errors(run['runId'])}\n{stack.logs()}"
    return run


def write_inbox(llama_env: LlamaEnv, day: str, source: str, rows: list[dict[str, str]]) -> None:
    inbox = Path(llama_env.home) / "inbox" / day
    inbox.mkdir(parents=True, exist_ok=True)
    (inbox / f"{source}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def metadata(materialization: dict[str, Any]) -> dict[str, Any]:
    """Label → value of a materialization's int/float/text/table-schema metadata entries."""
    values: dict[str, Any] = {}
    for entry in materialization["metadataEntries"]:
        for field in ("intValue", "floatValue", "text", "schema"):
            if field in entry:
                values[entry["label"]] = entry[field]
    return values


# ---- through GraphQL ---------------------------------------------------------------------------

WEB_DAY = "2025-06-01"
WEB_SOURCE = "webtest"
WEB_PARTITION = dg.MultiPartitionKey({DATE_DIMENSION: WEB_DAY, SOURCE_DIMENSION: WEB_SOURCE})
WEB_PROMPTS = [
    {"id": "web-1", "prompt": "Name one primary color."},
    {"id": "web-2", "prompt": "What is two plus two?"},
]


def assert_the_graph_and_instigators(stack: DagsterStack) -> None:
    """The asset graph, the schedule and the sensor, as the UI lists them."""
    nodes = stack.graphql.asset_nodes()
    assert set(BATCH_ASSETS + DIGEST_ASSETS) <= set(nodes)
    for key in BATCH_ASSETS:  # partitioned by date x source
        node = nodes[key]
        assert node["isPartitioned"]
        dims = {d["name"]: d for d in node["partitionDefinition"]["dimensionTypes"]}
        assert set(dims) == {DATE_DIMENSION, SOURCE_DIMENSION}
        assert dims[SOURCE_DIMENSION]["dynamicPartitionsDefinitionName"] == "source"
    for key in ("amplified_prompts", "distilled_responses", "digest_prefill"):
        assert nodes[key]["pools"] == ["llama_server"], key
    assert {"batch_job", "distillation_job"} <= set(nodes["distilled_responses"]["jobNames"])
    assert {"batch_job", "ingest_job"} <= set(nodes["amplified_prompts"]["jobNames"])

    schedules, sensors = stack.graphql.instigators()
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


@pytest.mark.timeout(2 * RUN_TIMEOUT_S + 600)
def test_webserver_serves_the_graph_and_runs_a_partition(
    llama_env: LlamaEnv, stack: DagsterStack, digest_run: dict[str, Any]
) -> None:
    write_inbox(llama_env, WEB_DAY, WEB_SOURCE, WEB_PROMPTS)
    graphql = stack.graphql
    try:
        assert_the_graph_and_instigators(stack)
        graphql.add_dynamic_partition("source", WEB_SOURCE)
        run_id = graphql.launch_partition_run("batch_job", WEB_PARTITION, SHORT_ANSWERS)
        run = graphql.wait_run(run_id, RUN_TIMEOUT_S)
        assert run["status"] == "SUCCESS", graphql.run_errors(run_id)
    except (AssertionError, TimeoutError) as error:
        raise AssertionError(f"{error}\n{stack.logs()}") from error

    tags = {tag["key"]: tag["value"] for tag in run["tags"]}
    assert tags["dagster/partition"] == str(WEB_PARTITION)
    assert tags["kimi_batch/job"] == "batch"
    by_asset = {"/".join(m["assetKey"]["path"]): m for m in run["assetMaterializations"]}
    assert set(by_asset) == set(BATCH_ASSETS)
    for key, materialization in by_asset.items():
        assert materialization["partition"] == str(WEB_PARTITION), key
        assert metadata(materialization)["rows"] >= 1, (key, metadata(materialization))
    assert metadata(by_asset["seed_prompts"])["rows"] == len(WEB_PROMPTS)
    for key in ("amplified_prompts", "distilled_responses"):
        values = metadata(by_asset[key])
        assert values["completion_tokens"] > 0, (key, values)
        assert values["max_in_flight"] <= llama_env.slots, (key, values)
    assert_standard_table_metadata(metadata(by_asset["distilled_responses"]), "distilled")
    assert_standard_table_metadata(metadata(by_asset["seed_prompts"]), "seeds")


def assert_standard_table_metadata(values: dict[str, Any], table: str) -> None:
    """Dagster's own keys, as the catalog reads them: row counts, the column schema from the row
    model, the Trino table and the file."""
    assert values["dagster/partition_row_count"] == values["rows"] >= 1, values
    assert values["dagster/row_count"] >= values["dagster/partition_row_count"], values
    assert values["dagster/table_name"].endswith(f".{table}"), values
    # The Iceberg table's location, and the snapshot the materialization's commit made current.
    assert values["dagster/uri"].endswith(f"/kimi_batch/{table}"), values
    assert int(values["snapshot_id"]) > 0, values
    columns = {column["name"]: column for column in values["dagster/column_schema"]["columns"]}
    expected = [name for name, _ in trino_columns(table)]
    assert list(columns) == expected, columns
    assert columns["input_sha256"]["type"] == "VARCHAR"
    assert columns["ds"]["constraints"]["nullable"] is False


# ---- through the browser -----------------------------------------------------------------------

ARTIFACTS = REPO_ROOT / "var" / "test-artifacts" / "browser"
# Yesterday: inside the date partitions whatever their configured start.
UI_DAY = (datetime.now(UTC).date() - timedelta(days=1)).isoformat()
UI_SOURCE = "browsertest"
UI_PARTITION = dg.MultiPartitionKey({DATE_DIMENSION: UI_DAY, SOURCE_DIMENSION: UI_SOURCE})
UI_TIMEOUT_MS = 120_000
CHECKS = ("no_duplicate_request_ids", "matches_table_schema", "no_empty_outputs")
# The upstream is set-up, not what the test is about: one short variant instead of one per
# strategy leaves the run launched from the UI (default config) two prompts to answer, not four.
ONE_VARIANT = {
    "ops": {"amplified_prompts": {"config": {"strategies": ["paraphrase"], "max_tokens": 48}}}
}
_RUNS_QUERY = "{ runsOrError(limit: 20) { ... on Runs { results { runId tags { key value } } } } }"


def _upstream(stack: DagsterStack) -> None:
    graphql = stack.graphql
    graphql.add_dynamic_partition("source", UI_SOURCE)
    upstream = graphql.wait_run(
        graphql.launch_assets_run(["seed_prompts", "amplified_prompts"], UI_PARTITION, ONE_VARIANT),
        RUN_TIMEOUT_S,
    )
    assert upstream["status"] == "SUCCESS", graphql.run_errors(upstream["runId"])


def _launch_from_dialog(page: Page) -> None:
    page.get_by_role("button", name="Materialize…").click()
    dialog = page.get_by_role("dialog")
    expect(dialog.get_by_text("Launch runs to materialize distilled_responses")).to_be_visible()
    date_input = dialog.get_by_placeholder("ex: ", exact=False)
    date_input.fill(UI_DAY)
    date_input.press("Enter")
    dialog.get_by_text("Select a partition or create one").click()
    page.get_by_role("menuitem").filter(has_text=UI_SOURCE).click()
    dialog.get_by_text("Launch runs to materialize").click()  # closes the source menu
    launch = dialog.get_by_role("button", name="Launch 1 run")
    expect(launch).to_be_enabled()
    screenshot(page, ARTIFACTS, "2-launch-dialog")
    launch.click()


def _partition_runs(stack: DagsterStack) -> set[str]:
    """Ids of the recent runs of the test partition."""
    runs: list[dict[str, Any]] = stack.graphql.query(_RUNS_QUERY)["runsOrError"]["results"]
    return {
        str(run["runId"])
        for run in runs
        if {t["key"]: t["value"] for t in run["tags"]}.get("dagster/partition") == str(UI_PARTITION)
    }


def _new_run_id(stack: DagsterStack, before: set[str], timeout_s: float = 120.0) -> str:
    """The run the dialog launched: the one partition run that was not there before."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        new = _partition_runs(stack) - before
        if new:
            assert len(new) == 1, new
            return new.pop()
        time.sleep(1.0)
    raise TimeoutError(f"no run of {UI_PARTITION} appeared within {timeout_s}s of the launch")


def _use_the_ui(page: Page, stack: DagsterStack) -> None:
    # The asset graph of the batch group: the three batch assets, wired.
    page.goto(f"{stack.base_url}/locations/kimi_batch/asset-groups/batch")
    dismiss_welcome(page)
    page.wait_for_load_state("networkidle")
    for name in BATCH_ASSETS:
        expect(page.get_by_text(name, exact=True).first).to_be_visible()
    screenshot(page, ARTIFACTS, "1-asset-graph")

    # distilled_responses: Materialize, one date|source partition, launch.
    page.goto(f"{stack.base_url}/assets/distilled_responses")
    dismiss_welcome(page)
    before = _partition_runs(stack)
    _launch_from_dialog(page)
    run_id = _new_run_id(stack, before)

    # The run page until the run is over; it must say Success.
    run = stack.graphql.wait_run(run_id, RUN_TIMEOUT_S)
    assert run["status"] == "SUCCESS", stack.graphql.run_errors(run_id)
    page.goto(f"{stack.base_url}/runs/{run_id}")
    expect(page.get_by_text("Success").first).to_be_visible()
    page.wait_for_load_state("networkidle")
    screenshot(page, ARTIFACTS, "3-run-succeeded")

    # The partition on the asset page: its metadata and its checks.
    page.goto(
        f"{stack.base_url}/assets/distilled_responses?view=partitions&partition={UI_PARTITION}"
    )
    expect(page.get_by_text(run_id[:8]).first).to_be_visible()
    for label in ("rows", "completion_tokens", "cache_hit_ratio"):
        expect(page.get_by_text(label, exact=True).first).to_be_visible()
    screenshot(page, ARTIFACTS, "4-partition-metadata")
    page.goto(f"{stack.base_url}/assets/distilled_responses?view=checks")
    for check in CHECKS:
        expect(page.get_by_text(check, exact=True).first).to_be_visible()
    screenshot(page, ARTIFACTS, "5-checks")


@pytest.mark.timeout(3 * RUN_TIMEOUT_S + 600)
def test_a_user_launches_a_partition_from_the_ui(
    llama_env: LlamaEnv, stack: DagsterStack, digest_run: dict[str, Any]
) -> None:
    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    ARTIFACTS.mkdir(parents=True)
    write_inbox(llama_env, UI_DAY, UI_SOURCE, [{"id": "ui-1", "prompt": "Name one primary color."}])

    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        page.set_default_timeout(UI_TIMEOUT_MS)
        try:
            _upstream(stack)
            _use_the_ui(page, stack)
        except (AssertionError, TimeoutError, PlaywrightError) as error:
            screenshot(page, ARTIFACTS, "failure")
            raise AssertionError(f"{error}\n{stack.logs()}") from error


# ---- two partition runs against the pool -------------------------------------------------------

POOL_SOURCES = ("pool_a", "pool_b")


@pytest.fixture
def sampler(llama_env: LlamaEnv) -> Iterator[ServerSampler]:
    with sampling(llama_env.base_url) as sampler:
        yield sampler


@pytest.mark.timeout(2 * RUN_TIMEOUT_S + 600)
def test_two_partition_runs_never_overload_the_server(
    llama_env: LlamaEnv, stack: DagsterStack, sampler: ServerSampler
) -> None:
    for index, source in enumerate(POOL_SOURCES):
        rows = [
            {"id": f"{source}-1", "prompt": f"Name a color number {index}."},
            {"id": f"{source}-2", "prompt": f"What is {index} plus two?"},
        ]
        write_inbox(llama_env, POOL_DAY, source, rows)
    try:
        runs = run_two_partitions_together(
            stack.graphql,
            "batch_job",
            POOL_SOURCES,
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
