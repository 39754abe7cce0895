"""The Dagster UI in a real browser: Playwright drives Debian's chromium against the real code location.

The webserver + daemon run on a free loopback port (`DagsterStack`) against the session's real
llama-server. The upstream of one partition (digest, seed_prompts, amplified_prompts) is launched
through GraphQL; then, as a user would: open the asset graph, open `distilled_responses`, press
Materialize, pick the partition in the launch dialog, launch it, watch the run page until it says
Success, and read the partition's metadata and checks on the asset page.

Chromium comes from Debian (`make test` installs it with apt-get); Playwright is pointed at it
with `executable_path` and never downloads a browser. Screenshots are kept under
var/test-artifacts/browser/ (the path is printed).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright
from playwright.sync_api import Error as PlaywrightError

from kimi_batch.defs.partitions import DATE_DIMENSION, SOURCE_DIMENSION
from kimi_batch_tests.support.dagster_stack import DagsterStack
from kimi_batch_tests.support.repo import REPO_ROOT

pytestmark = pytest.mark.slow

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = REPO_ROOT / "var" / "test-artifacts" / "browser"
# Yesterday: inside the date partitions whatever their configured start.
DAY = (datetime.now(UTC).date() - timedelta(days=1)).isoformat()
SOURCE = "browsertest"
PARTITION = dg.MultiPartitionKey({DATE_DIMENSION: DAY, SOURCE_DIMENSION: SOURCE})
RUN_TIMEOUT_S = 1500.0
UI_TIMEOUT_MS = 120_000
CHECKS = ("no_duplicate_request_ids", "matches_table_schema", "no_empty_outputs")
# The upstream is set-up, not what the test is about: one short variant instead of one per
# strategy leaves the run launched from the UI (default config) two prompts to answer, not four.
ONE_VARIANT = {
    "ops": {"amplified_prompts": {"config": {"strategies": ["paraphrase"], "max_tokens": 48}}}
}


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert CHROMIUM.exists(), "chromium missing: `apt-get install chromium` (make test does it)"
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        try:
            yield launched
        finally:
            launched.close()


def _shot(page: Page, name: str) -> Path:
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")
    return path


def _dismiss_welcome(page: Page) -> None:
    """A fresh profile gets Dagster's community dialog once; skip it when it shows."""
    skip = page.get_by_role("button", name="Skip")
    with contextlib.suppress(PlaywrightError):  # absent on this version or already dismissed
        skip.click(timeout=5000)


def _upstream(stack: DagsterStack) -> None:
    graphql = stack.graphql
    digest = graphql.wait_run(
        graphql.launch_assets_run(["system_digest", "digest_prefill"]), RUN_TIMEOUT_S
    )
    assert digest["status"] == "SUCCESS", graphql.run_errors(digest["runId"])
    graphql.add_dynamic_partition("source", SOURCE)
    upstream = graphql.wait_run(
        graphql.launch_assets_run(["seed_prompts", "amplified_prompts"], PARTITION, ONE_VARIANT),
        RUN_TIMEOUT_S,
    )
    assert upstream["status"] == "SUCCESS", graphql.run_errors(upstream["runId"])


def _launch_from_dialog(page: Page) -> None:
    page.get_by_role("button", name="Materialize…").click()
    dialog = page.get_by_role("dialog")
    expect(dialog.get_by_text("Launch runs to materialize distilled_responses")).to_be_visible()
    date_input = dialog.get_by_placeholder("ex: ", exact=False)
    date_input.fill(DAY)
    date_input.press("Enter")
    dialog.get_by_text("Select a partition or create one").click()
    page.get_by_role("menuitem").filter(has_text=SOURCE).click()
    dialog.get_by_text("Launch runs to materialize").click()  # closes the source menu
    launch = dialog.get_by_role("button", name="Launch 1 run")
    expect(launch).to_be_enabled()
    _shot(page, "2-launch-dialog")
    launch.click()


_RUNS_QUERY = "{ runsOrError(limit: 20) { ... on Runs { results { runId tags { key value } } } } }"


def _partition_runs(stack: DagsterStack) -> set[str]:
    """Ids of the recent runs of the test partition."""
    runs: list[dict[str, Any]] = stack.graphql.query(_RUNS_QUERY)["runsOrError"]["results"]
    return {
        str(run["runId"])
        for run in runs
        if {t["key"]: t["value"] for t in run["tags"]}.get("dagster/partition") == str(PARTITION)
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
    raise TimeoutError(f"no run of {PARTITION} appeared within {timeout_s}s of the launch")


@pytest.mark.timeout(3 * RUN_TIMEOUT_S + 600)
def test_a_user_launches_a_partition_from_the_ui(
    llama_env: Any, tmp_path: Path, browser: Browser
) -> None:
    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    ARTIFACTS.mkdir(parents=True)
    inbox = Path(llama_env.home) / "inbox" / DAY
    inbox.mkdir(parents=True, exist_ok=True)
    rows = [{"id": "ui-1", "prompt": "Name one primary color."}]
    (inbox / f"{SOURCE}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))

    with DagsterStack(
        tmp_path / "dagster_home", workspace=REPO_ROOT / "workspace.yaml", location="kimi_batch"
    ) as stack:
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        page.set_default_timeout(UI_TIMEOUT_MS)
        try:
            _upstream(stack)

            # The asset graph of the batch group: the three batch assets, wired.
            page.goto(f"{stack.base_url}/locations/kimi_batch/asset-groups/batch")
            _dismiss_welcome(page)
            page.wait_for_load_state("networkidle")
            for name in ("seed_prompts", "amplified_prompts", "distilled_responses"):
                expect(page.get_by_text(name, exact=True).first).to_be_visible()
            _shot(page, "1-asset-graph")

            # distilled_responses: Materialize, one date|source partition, launch.
            page.goto(f"{stack.base_url}/assets/distilled_responses")
            _dismiss_welcome(page)
            before = _partition_runs(stack)
            _launch_from_dialog(page)
            run_id = _new_run_id(stack, before)

            # The run page until the run is over; it must say Success.
            run = stack.graphql.wait_run(run_id, RUN_TIMEOUT_S)
            assert run["status"] == "SUCCESS", stack.graphql.run_errors(run_id)
            page.goto(f"{stack.base_url}/runs/{run_id}")
            expect(page.get_by_text("Success").first).to_be_visible()
            page.wait_for_load_state("networkidle")
            _shot(page, "3-run-succeeded")

            # The partition on the asset page: its metadata and its checks.
            page.goto(
                f"{stack.base_url}/assets/distilled_responses?view=partitions&partition={PARTITION}"
            )
            expect(page.get_by_text(run_id[:8]).first).to_be_visible()
            for label in ("rows", "completion_tokens", "cache_hit_ratio"):
                expect(page.get_by_text(label, exact=True).first).to_be_visible()
            _shot(page, "4-partition-metadata")
            page.goto(f"{stack.base_url}/assets/distilled_responses?view=checks")
            for check in CHECKS:
                expect(page.get_by_text(check, exact=True).first).to_be_visible()
            _shot(page, "5-checks")
        except (AssertionError, TimeoutError, PlaywrightError) as error:
            _shot(page, "failure")
            raise AssertionError(f"{error}\n{stack.logs()}") from error
