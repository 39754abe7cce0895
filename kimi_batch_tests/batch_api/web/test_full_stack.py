"""The Batch API on the real stack, driven by the official `openai` client as users drive it.

Real llama-server (SmolLM2), a real Dagster webserver + daemon (the API batch sensor starts each
batch's run), real Iceberg tables and a real Trino. Cancel and terminate are checked on the server
itself: its `/slots` show every slot idle soon after, and the seconds it took are printed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest
from openai.types import Batch
from openai.types.chat import ChatCompletion

from kimi_batch.batch_api import ApiStore
from kimi_batch.batch_api.web.runs import LAUNCHED_BY_TAG, BatchRuns, RunMode
from kimi_batch.defs.assets.stage_asset import LLAMA_POOL
from kimi_batch.settings import Settings
from kimi_batch.warehouse import TrinoConfig, TrinoReader, Warehouse, open_warehouse
from kimi_batch_tests.support.api_server import serving_api
from kimi_batch_tests.support.batches import MODEL
from kimi_batch_tests.support.graphql import GraphQL
from kimi_batch_tests.support.kimi_batch_stack import API_KEY, KimiBatchStack
from kimi_batch_tests.support.llama_server import LlamaEnv
from kimi_batch_tests.support.processes import descendants

pytestmark = pytest.mark.slow

BATCH_TIMEOUT_S = 900.0
DAEMON_BEAT_TIMEOUT_S = 180.0
# Generous: a correctness bound (the slots do go idle), not a speed target; the measured
# seconds are printed (streamed requests: cancel 1.2 s, terminate 1.0 s; kill 12.2 s here). The
# batch's one logprobs request is sent whole, and this llama-server runs a non-streamed request
# whose client went away to its end, so on a loaded machine that answer may hold its slot.
IDLE_BOUND_S = 30.0
FINAL = ("completed", "failed", "cancelled", "expired")
# dagster.yaml's run monitoring frees a dead run's pool slot ~20 s after the run failed (a 10 s
# poll, 10 s after its end); the bound leaves a loaded machine room and fails the 6 minutes of
# Dagster's example settings.
SLOT_FREED_BOUND_S = 90.0
SYSTEM = "You are a geography teacher. Answer in one short sentence."
CAPITAL_SCHEMA = {
    "type": "object",
    "properties": {"capital": {"type": "string"}},
    "required": ["capital"],
}


@dataclass(frozen=True)
class Stack:
    client: openai.OpenAI
    graphql: GraphQL
    settings: Settings
    warehouse: Warehouse
    trino: TrinoConfig
    llama: LlamaEnv
    runs: BatchRuns


@pytest.fixture(scope="module")
def stack(kimi_batch_stack: KimiBatchStack) -> Iterator[Stack]:
    """The Batch API served here, as `kimi-batch api` serves it, beside the session's stack."""
    with pytest.MonkeyPatch.context() as patch:
        # The API's own launcher runs on the daemon's instance: it must leave every batch to
        # the daemon.
        patch.setenv("DAGSTER_HOME", str(kimi_batch_stack.dagster_home))
        settings = Settings.from_env()
        warehouse, trino = open_warehouse(settings), TrinoConfig.from_settings(settings)
        runs = BatchRuns(settings)
        deadline = time.monotonic() + DAEMON_BEAT_TIMEOUT_S
        while runs.mode() is not RunMode.DAEMON:
            dagster = kimi_batch_stack.dagster
            assert time.monotonic() < deadline, f"no daemon heartbeat: {dagster.logs()}"
            time.sleep(1)
        with serving_api(settings, runs=runs) as base_url:
            client = openai.OpenAI(base_url=base_url, api_key=API_KEY, max_retries=0)
            yield Stack(
                client,
                kimi_batch_stack.dagster.graphql,
                settings,
                warehouse,
                trino,
                kimi_batch_stack.llama,
                runs,
            )


def request(custom_id: str, content: str, *, system: str | None = None, **body: Any) -> str:
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": content})
    line = {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": MODEL, "messages": messages, **body},
    }
    return json.dumps(line)


def submit(client: openai.OpenAI, lines: list[str]) -> Batch:
    upload = client.files.create(
        file=("batch.jsonl", ("\n".join(lines) + "\n").encode()), purpose="batch"
    )
    return client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )


def wait_for(
    client: openai.OpenAI, batch_id: str, done: Any, timeout_s: float = BATCH_TIMEOUT_S
) -> Batch:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if done(batch):
            return batch
        time.sleep(0.2)
    raise TimeoutError(f"{batch_id} is still {client.batches.retrieve(batch_id).status}")


def busy_slots(llama: LlamaEnv) -> int:
    slots = httpx.get(f"{llama.base_url}/slots", timeout=10).json()
    return sum(1 for slot in slots if slot.get("is_processing"))


def seconds_until_idle(llama: LlamaEnv, since: float, why: Any = None) -> float:
    """Seconds from `since` until no slot is processing; `why()` explains a failure."""
    while busy_slots(llama):
        if time.monotonic() - since > IDLE_BOUND_S:
            slots = httpx.get(f"{llama.base_url}/slots", timeout=10).json()
            shown = [
                {k: slot.get(k) for k in ("id", "is_processing", "id_task", "n_ctx")}
                for slot in slots
            ]
            raise AssertionError(f"slots still busy: {shown}; {why() if why else ''}")
        time.sleep(0.05)
    return time.monotonic() - since


def output_lines(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    assert file_id is not None
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


# A batch the tests end early: one short answer lands at once while the other requests, up to
# 128 tokens each, are still being generated on their slots (4 requests, 4 slots: all in flight
# together), so ending it then keeps one answer and cuts the rest; the rerun generates those.
ENDED_EARLY = 4


def long_requests(prefix: str) -> list[str]:
    """The first request of at most 8 tokens, the others of up to 128: when the first answer
    lands, the others have most of their tokens still to generate."""
    topics = ["rivers", "mountains", "deserts", "oceans", "forests", "islands", "lakes", "caves"]
    return [
        # The prefix is in the prompt: the same content is answered once, from the ledger.
        request(f"{prefix}-{i}", f"Write a long, detailed essay about {topics[i % 8]} ({prefix}).",
                max_tokens=8 if i == 0 else 128, temperature=0.8, seed=i)
        for i in range(ENDED_EARLY)
    ]  # fmt: skip


def run_metadata(graphql: GraphQL, run_id: str) -> dict[str, Any]:
    [materialization] = graphql.run(run_id)["assetMaterializations"]
    values: dict[str, Any] = {}
    for entry in materialization["metadataEntries"]:
        for field in ("intValue", "floatValue", "text"):
            if field in entry:
                values[entry["label"]] = entry[field]
    return values


def answered_before_the_end(
    client: openai.OpenAI, batch: Batch, *, unanswered_code: str, total: int
) -> int:
    """How many requests a batch ended early answered: each request is in its partial output
    file or, with `unanswered_code`, in its error file."""
    answered = output_lines(client, batch.output_file_id) if batch.output_file_id else []
    unanswered = output_lines(client, batch.error_file_id)
    assert len(answered) + len(unanswered) == total
    assert {line["error"]["code"] for line in unanswered} == {unanswered_code}
    return len(answered)


def rerun_sends_only_the_rest(stack: Stack, batch_id: str, *, answered: int, total: int) -> None:
    """A later run of the batch's partition sends only what is missing and lands every row."""
    graphql = stack.graphql
    rerun = graphql.launch_dynamic_partition_run("api_batch_job", batch_id)
    finished = graphql.wait_run(rerun, BATCH_TIMEOUT_S)
    assert finished["status"] == "SUCCESS", graphql.run_errors(rerun)
    metadata = run_metadata(graphql, rerun)
    assert metadata["from_ledger"] == answered
    assert metadata["generated"] == total - answered
    with ApiStore(stack.settings.paths) as store:
        record = store.batch(batch_id)
    assert record is not None
    assert record.ds
    # Every request is a row: a final answer in `distilled`, an answer cut at max_tokens in
    # quarantine.
    distilled = stack.warehouse.read_partition("distilled", record.ds, batch_id)
    quarantine = stack.warehouse.read_partition("quarantine", record.ds, batch_id)
    assert distilled.height + quarantine.height == total


def test_a_batch_is_answered_as_submitted_and_lands_in_the_tables(stack: Stack) -> None:
    geography = ["France", "Japan", "Italy", "Spain"]
    lines = [
        *(
            request(f"sys-{country}", f"What is the capital of {country}?", system=SYSTEM,
                    max_tokens=64, temperature=0, seed=1)
            for country in geography
        ),
        request("json", "Give the capital of France as JSON.", max_tokens=48, temperature=0,
                response_format={"type": "json_schema",
                                 "json_schema": {"name": "capital", "schema": CAPITAL_SCHEMA}}),
        request("logprobs", "Say hello.", max_tokens=8, logprobs=True, top_logprobs=2),
        request("cut", "Tell me a long story about a dragon.", max_tokens=2),
        request("plain", "Name one color.", max_tokens=24, temperature=0),
    ]  # fmt: skip
    client = stack.client
    batch = submit(client, lines)
    assert batch.status == "validating"
    seen_in_progress = wait_for(client, batch.id, lambda b: b.status != "validating")
    assert seen_in_progress.status in ("in_progress", "finalizing", "completed")
    done = wait_for(client, batch.id, lambda b: b.status in FINAL)
    assert done.status == "completed", done
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed) == (8, 8)
    assert done.in_progress_at
    assert done.finalizing_at
    assert done.completed_at
    assert done.error_file_id is None

    outputs = output_lines(client, done.output_file_id)
    by_id = {line["custom_id"]: line for line in outputs}
    assert sorted(by_id) == sorted(json.loads(line)["custom_id"] for line in lines)
    assert len(outputs) == len(by_id) == 8
    completions = {
        custom_id: ChatCompletion.model_validate(line["response"]["body"])
        for custom_id, line in by_id.items()
    }
    assert json.loads(completions["json"].choices[0].message.content or "")["capital"]
    logprobs = completions["logprobs"].choices[0].logprobs
    assert logprobs is not None
    assert logprobs.content
    assert all(len(token.top_logprobs) == 2 for token in logprobs.content)
    assert completions["cut"].choices[0].finish_reason == "length"
    # The shared system prompt was prefilled once and restored: every request of it hit it.
    for country in geography:
        usage = completions[f"sys-{country}"].usage
        assert usage is not None
        assert usage.prompt_tokens_details is not None
        assert (usage.prompt_tokens_details.cached_tokens or 0) > 0

    with ApiStore(stack.settings.paths) as store:
        record = store.batch(batch.id)
    assert record is not None
    assert record.ds
    assert record.run_id
    finished = stack.graphql.wait_run(record.run_id, 120)
    assert finished["status"] == "SUCCESS"
    # With a daemon serving the instance, its sensor started the run, not `kimi-batch api`.
    tags = {tag["key"]: tag["value"] for tag in finished["tags"]}
    assert tags["dagster/sensor_name"] == "api_batch_sensor"
    assert LAUNCHED_BY_TAG not in tags
    assert stack.runs.mode() is RunMode.DAEMON
    metadata = run_metadata(stack.graphql, record.run_id)
    assert metadata["cache_hit_ratio"] > 0
    assert metadata["generated"] == 8

    distilled = stack.warehouse.read_partition("distilled", record.ds, batch.id)
    quarantine = stack.warehouse.read_partition("quarantine", record.ds, batch.id)
    answered = set(distilled["seed_id"].to_list())
    set_aside = set(quarantine["input_id"].to_list()) if quarantine.height else set()
    assert "cut" in set_aside
    assert "cut" not in answered
    assert answered | set_aside == set(by_id)
    assert {"json", "plain"} <= answered
    with TrinoReader(stack.trino) as trino:
        rows = trino.count("distilled", source=batch.id)
    assert rows == distilled.height


def test_cancel_mid_batch_frees_the_slots_keeps_the_answers_and_a_rerun_finishes(
    stack: Stack,
) -> None:
    client = stack.client
    batch = submit(client, long_requests("essay"))
    running = wait_for(
        client, batch.id, lambda b: b.request_counts is not None and b.request_counts.completed
    )
    assert running.status == "in_progress"
    assert busy_slots(stack.llama) > 0
    cancelled_at = time.monotonic()
    assert client.batches.cancel(batch.id).status == "cancelling"
    idle_s = seconds_until_idle(
        stack.llama, cancelled_at, lambda: client.batches.retrieve(batch.id).model_dump()
    )
    print(f"\nBatch API cancel -> every slot idle: {idle_s:.2f} s")
    done = wait_for(client, batch.id, lambda b: b.status == "cancelled", timeout_s=120)
    assert done.cancelled_at is not None
    answered = answered_before_the_end(
        client, done, unanswered_code="batch_cancelled", total=ENDED_EARLY
    )
    assert 1 <= answered < ENDED_EARLY
    # The user's cancel ends the run CANCELED, as a terminate does: no failure event, no alert.
    with ApiStore(stack.settings.paths) as store:
        record = store.batch(batch.id)
    assert record is not None
    assert record.run_id
    run = stack.graphql.wait_run(record.run_id, 120)
    assert run["status"] == "CANCELED", stack.graphql.run_errors(record.run_id)
    events = stack.graphql.run_events(record.run_id)
    assert not [event for event in events if event["__typename"] == "RunFailureEvent"]

    rerun_sends_only_the_rest(stack, batch.id, answered=answered, total=ENDED_EARLY)
    assert client.batches.retrieve(batch.id).status == "cancelled"  # a final status stays


def test_terminating_the_run_from_the_ui_frees_the_slots(stack: Stack) -> None:
    client, graphql = stack.client, stack.graphql
    batch = submit(client, long_requests("term"))
    wait_for(client, batch.id, lambda b: b.status == "in_progress")
    deadline = time.monotonic() + 120
    while not busy_slots(stack.llama):
        assert time.monotonic() < deadline, "no request reached the server"
        time.sleep(0.1)
    with ApiStore(stack.settings.paths) as store:
        record = store.batch(batch.id)
    assert record is not None
    run_id = record.run_id
    assert run_id
    terminated_at = time.monotonic()
    graphql.terminate_run(run_id)
    idle_s = seconds_until_idle(stack.llama, terminated_at, lambda: graphql.run(run_id)["status"])
    print(f"\nDagster terminateRun -> every slot idle: {idle_s:.2f} s")
    assert graphql.wait_run(run_id, 120)["status"] == "CANCELED"
    done = wait_for(client, batch.id, lambda b: b.status in FINAL, timeout_s=120)
    assert done.status == "cancelled", done
    assert done.cancelling_at is not None
    assert done.cancelled_at is not None
    answered = answered_before_the_end(
        client, done, unanswered_code="batch_cancelled", total=ENDED_EARLY
    )
    assert done.request_counts is not None
    assert done.request_counts.completed == answered < ENDED_EARLY
    rerun_sends_only_the_rest(stack, batch.id, answered=answered, total=ENDED_EARLY)
    assert client.batches.retrieve(batch.id).status == "cancelled"


def test_a_run_killed_hard_fails_its_batch_with_the_partial_output(stack: Stack) -> None:
    """SIGKILL of the run worker and its step: the code server fails the run, the API sensor
    finalizes the batch (it would say in_progress forever), and a rerun sends the rest."""
    client, graphql = stack.client, stack.graphql
    batch = submit(client, long_requests("kill"))
    wait_for(
        client, batch.id, lambda b: b.request_counts is not None and b.request_counts.completed
    )
    with ApiStore(stack.settings.paths) as store:
        record = store.batch(batch.id)
    assert record is not None
    run_id = record.run_id
    assert run_id
    worker = graphql.run_worker_pid(run_id)
    killed_at = time.monotonic()
    for pid in [*descendants(worker), worker]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    idle_s = seconds_until_idle(stack.llama, killed_at)
    print(f"\nrun worker SIGKILL -> every slot idle: {idle_s:.2f} s")
    assert graphql.wait_run(run_id, 120)["status"] == "FAILURE"
    done = wait_for(client, batch.id, lambda b: b.status in FINAL, timeout_s=120)
    print(f"run worker SIGKILL -> batch {done.status}: {time.monotonic() - killed_at:.2f} s")
    # The dead step never released its slot of the one-slot pool: run monitoring frees it, soon
    # enough that the next batch is not left queued behind a dead run for minutes.
    failed_at = time.monotonic()
    while run_id in graphql.pool_holders(LLAMA_POOL):
        assert time.monotonic() - failed_at < SLOT_FREED_BOUND_S, "the dead run keeps its slot"
        time.sleep(0.5)
    print(f"run worker SIGKILL -> pool slot freed: {time.monotonic() - killed_at:.2f} s")
    assert done.status == "failed", done
    assert done.failed_at is not None
    assert done.errors is not None
    [error] = done.errors.data or []
    assert error.code == "run_failed"
    assert run_id in (error.message or "")
    answered = answered_before_the_end(
        client, done, unanswered_code="batch_failed", total=ENDED_EARLY
    )
    assert 1 <= answered < ENDED_EARLY
    rerun_sends_only_the_rest(stack, batch.id, answered=answered, total=ENDED_EARLY)
    assert client.batches.retrieve(batch.id).status == "failed"  # a final status stays
