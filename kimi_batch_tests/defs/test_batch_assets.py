"""The partitioned batch assets on a real instance, real server and real Parquet files."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import dagster as dg
import httpx
import polars as pl
import pytest
from pydantic import BaseModel

from kimi_batch.crash_points import armed
from kimi_batch.definitions import batch_assets, build_resources
from kimi_batch.defs.assets.batch import resolve_seeds_input, seeds_are_current
from kimi_batch.defs.partitions import SOURCE_PARTITIONS_NAME
from kimi_batch.defs.resources import WarehouseResource
from kimi_batch.settings import Settings
from kimi_batch.warehouse import Warehouse
from kimi_batch_tests.support.llama_server import LlamaEnv

pytestmark = pytest.mark.slow  # every test materializes on a real llama-server

SMALL_RUN: dict[str, Any] = {
    "ops": {
        "amplified_prompts": {"config": {"strategies": ["paraphrase"], "max_tokens": 32}},
        "distilled_responses": {"config": {"max_tokens": 48}},
    }
}


def _today() -> str:
    return datetime.now(UTC).date().isoformat()


def _write_inbox(home: Path, name: str, lines: list[str]) -> Path:
    inbox = home / "inbox"
    inbox.mkdir(parents=True, exist_ok=True)
    path = inbox / name
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def _key(source: str) -> dg.MultiPartitionKey:
    return dg.MultiPartitionKey({"date": _today(), "source": source})


def _materialize(
    instance: dg.DagsterInstance,
    source: str,
    selection: list[str] | None = None,
    *,
    answer_tokens: int | None = None,
) -> dg.ExecuteInProcessResult:
    """`answer_tokens`: the distilled answers' max_tokens, for a test that needs them finished."""
    instance.add_dynamic_partitions(SOURCE_PARTITIONS_NAME, [source])
    ops = dict(SMALL_RUN["ops"])
    if answer_tokens is not None:
        ops["distilled_responses"] = {"config": {"max_tokens": answer_tokens}}
    return dg.materialize(
        batch_assets(Settings.from_env()),
        selection=selection,
        partition_key=_key(source),
        resources=build_resources(Settings.from_env()),
        instance=instance,
        run_config={
            "ops": {
                op: config for op, config in ops.items() if selection is None or op in selection
            }
        },
    )


def _warehouse(env: LlamaEnv) -> Warehouse:
    return Warehouse(env.home / "warehouse")


def test_malformed_rows_are_quarantined_and_good_rows_generated(llama_env: LlamaEnv) -> None:
    _write_inbox(
        llama_env.home,
        "mixed.jsonl",
        [
            # Prompts no other test of the session's home asks: the quality gate sets aside a
            # repeat of an answer kept before, and every answer of one kept earlier left this
            # test no row (CI); answers room to finish, as one cut off is set aside too.
            json.dumps({"id": "good-1", "prompt": "What is a noun? Answer in one sentence."}),
            "{not json at all",
            json.dumps({"id": "wrong-type", "prompt": 42}),
            json.dumps({"id": "empty", "prompt": "   "}),
            json.dumps({"id": "too-long", "prompt": "word " * 3000}),
            json.dumps({"id": "good-2", "prompt": "Name one planet of the solar system."}),
        ],
    )
    with dg.instance_for_test() as instance:
        result = _materialize(instance, "mixed", answer_tokens=160)
    assert result.success

    warehouse = _warehouse(llama_env)
    quarantine = warehouse.read_partition("quarantine", _today(), "mixed")
    input_rows = quarantine.filter(pl.col("stage") == "input").sort("line")
    assert input_rows["line"].to_list() == [2, 3, 4, 5]
    reasons = dict(zip(input_rows["line"].to_list(), input_rows["reason"].to_list(), strict=True))
    assert "JSON" in reasons[2] or "json" in reasons[2]
    assert "prompt" in reasons[3]
    assert "empty" in reasons[4]
    assert "token" in reasons[5]
    distilled = warehouse.read_partition("distilled", _today(), "mixed")
    seeds = distilled.filter(pl.col("origin") == "seed")
    # An answer cut off at max_tokens is set aside (never a final answer), not lost.
    distill_aside = quarantine.filter(pl.col("stage") == "distill")
    answered = set(seeds["input_id"].to_list()) | set(distill_aside["input_id"].to_list())
    assert {"good-1", "good-2"} <= answered
    assert distilled.height > 0
    for column in (
        "request_id",
        "input_id",
        "model",
        "digest_sha256",
        "prompt_tokens",
        "cached_tokens",
        "completion_tokens",
        "finish_reason",
    ):
        assert distilled[column].null_count() == 0, column


def test_rematerializing_a_partition_replaces_it_without_duplicates(llama_env: LlamaEnv) -> None:
    _write_inbox(
        llama_env.home,
        "again.jsonl",
        [
            json.dumps({"id": f"a{i}", "prompt": f"Give one fact about the number {i}."})
            for i in range(3)
        ],
    )
    warehouse = _warehouse(llama_env)
    with dg.instance_for_test() as instance:
        first = _materialize(instance, "again")
        rows_first = warehouse.read_partition("distilled", _today(), "again")
        second = _materialize(instance, "again")
        rows_second = warehouse.read_partition("distilled", _today(), "again")
    assert first.success
    assert second.success
    assert rows_second.height == rows_first.height
    assert rows_second["request_id"].n_unique() == rows_second.height
    assert sorted(rows_second["request_id"].to_list()) == sorted(rows_first["request_id"].to_list())
    (materialization,) = second.asset_materializations_for_node("distilled_responses")
    assert materialization.metadata["generated"].value == 0  # all from the ledger
    # Every request, final answers and set-aside (truncated) ones alike, comes from the ledger.
    assert (
        materialization.metadata["from_ledger"].value == materialization.metadata["requests"].value
    )
    requests = materialization.metadata["requests"].value
    assert isinstance(requests, int)
    assert requests >= rows_first.height


_CHILD = """
import json
import sys
import dagster as dg
import httpx
from kimi_batch.definitions import batch_assets, build_resources
from kimi_batch.settings import Settings
instance = dg.DagsterInstance.from_config(sys.argv[1])
key = dg.MultiPartitionKey({"date": sys.argv[2], "source": sys.argv[3]})
dg.materialize(batch_assets(Settings.from_env()), selection=["distilled_responses"], partition_key=key,
               resources=build_resources(Settings.from_env()), instance=instance,
               run_config=json.loads(sys.argv[4]))
"""


def _wait_until_idle(base_url: str, log_path: Path, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    quiet, last = 0, -1
    while quiet < 3 and time.monotonic() < deadline:
        busy = any(
            slot["is_processing"] for slot in httpx.get(f"{base_url}/slots", timeout=10).json()
        )
        launches = log_path.read_text(errors="replace").count("launch_slot_: id")
        quiet = quiet + 1 if not busy and launches == last else 0
        last = launches
        time.sleep(0.5)
    assert quiet >= 3, "the server never went idle after the kill"


def _ledger_rows(env: LlamaEnv, input_ids: set[str]) -> int:
    """Finished distillation requests of these inputs (amplification rows share seed ids)."""
    path = env.home / "ledger" / "ledger.sqlite3"
    with sqlite3.connect(path, timeout=30) as db:
        rows = [json.loads(row[0]) for row in db.execute("SELECT result_json FROM results")]
    return sum(
        1
        for row in rows
        if row["input_id"] in input_ids
        and (row["tag"] == "seed" or row["tag"].startswith("variant:"))
    )


def test_a_sigkilled_materialization_resumes_without_losing_or_repeating_rows(
    llama_env: LlamaEnv, tmp_path: Path
) -> None:
    # 4 seeds and their 4 variants: 8 distillation requests, twice the 4 slots, so a kill after
    # 3 are in the ledger lands mid-batch with requests both in flight and not yet sent.
    seeds = [f"k{i}" for i in range(4)]
    _write_inbox(
        llama_env.home,
        "killed.jsonl",
        [
            json.dumps({"id": s, "prompt": f"Describe the colour number {i} of a rainbow."})
            for i, s in enumerate(seeds)
        ],
    )
    dagster_home = tmp_path / "dagster"
    dagster_home.mkdir()
    instance = dg.DagsterInstance.from_config(str(dagster_home))
    upstream = _materialize(instance, "killed", ["seed_prompts", "amplified_prompts"])
    assert upstream.success
    variants = _warehouse(llama_env).read_partition("amplified", _today(), "killed")
    expected_inputs = set(seeds) | set(variants["request_id"].to_list())
    expected = len(expected_inputs)

    log_path = llama_env.server.log_path
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _CHILD,
            str(dagster_home),
            _today(),
            "killed",
            # The same config as the rerun: other params would be other requests.
            json.dumps({"ops": {"distilled_responses": SMALL_RUN["ops"]["distilled_responses"]}}),
        ],
        env=dict(os.environ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 600
    while _ledger_rows(llama_env, expected_inputs) < 3 and time.monotonic() < deadline:
        assert child.poll() is None, "the materialization ended before it could be killed"
        time.sleep(0.1)
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    finished = _ledger_rows(llama_env, expected_inputs)
    assert 3 <= finished < expected, "the kill must land mid-batch"

    # Requests the dead client had already sent still reach the slots: count from quiescence.
    _wait_until_idle(llama_env.base_url, log_path)
    launches_before = log_path.read_text(errors="replace").count("launch_slot_: id")
    rerun = _materialize(instance, "killed", ["distilled_responses"])
    launches = log_path.read_text(errors="replace").count("launch_slot_: id") - launches_before
    assert rerun.success

    distilled = _warehouse(llama_env).read_partition("distilled", _today(), "killed")
    set_aside = (
        _warehouse(llama_env)
        .read_partition("quarantine", _today(), "killed")
        .filter(pl.col("stage") == "distill")
    )
    # Each request exactly once: a final answer, or set aside (cut off at max_tokens).
    ids = distilled["request_id"].to_list() + set_aside["request_id"].to_list()
    assert len(ids) == len(set(ids)) == expected
    assert set(distilled["input_id"].to_list()) | set(set_aside["input_id"].to_list()) == (
        expected_inputs
    )
    assert launches == expected - finished
    (materialization,) = rerun.asset_materializations_for_node("distilled_responses")
    assert materialization.metadata["from_ledger"].value == finished


class CapitalAnswer(BaseModel):
    """The structured answer the distillation below is constrained to."""

    answer: str


def test_schema_constrained_answers_and_logprobs_land_in_the_table(
    llama_env: LlamaEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KIMI_BATCH_OUTPUT_MODEL_MODULES", "kimi_batch_tests.defs")
    _write_inbox(
        llama_env.home,
        "structured.jsonl",
        [
            json.dumps({"id": "cap-fr", "prompt": "What is the capital of France? Reply in JSON."}),
            json.dumps({"id": "cap-jp", "prompt": "What is the capital of Japan? Reply in JSON."}),
        ],
    )
    run_config = {
        "ops": {
            "amplified_prompts": {"config": {"strategies": ["paraphrase"], "max_tokens": 32}},
            "distilled_responses": {
                "config": {
                    "max_tokens": 48,
                    "temperature": 0.0,
                    "n_probs": 3,
                    "output_model": f"{__name__}:CapitalAnswer",
                }
            },
        }
    }
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(SOURCE_PARTITIONS_NAME, ["structured"])
        result = dg.materialize(
            batch_assets(Settings.from_env()),
            partition_key=_key("structured"),
            resources=build_resources(Settings.from_env()),
            instance=instance,
            run_config=run_config,
        )
    assert result.success
    warehouse = _warehouse(llama_env)
    rows = warehouse.read_partition("distilled", _today(), "structured")
    set_aside = warehouse.read_partition("quarantine", _today(), "structured").filter(
        pl.col("stage") == "distill"
    )
    variants = warehouse.read_partition("amplified", _today(), "structured")
    assert rows.height + set_aside.height == 2 + variants.height
    structured = [value for value in rows["structured"].to_list() if value is not None]
    assert structured, "no answer validated against the schema"
    for value in structured:
        CapitalAnswer.model_validate_json(value)
    for row in rows.iter_rows(named=True):
        assert row["logprobs"] is not None
        assert len(row["logprobs"]) == row["completion_tokens"]
        assert all(len(token["top"]) == 3 for token in row["logprobs"])
        # The teacher's token ids land too: what a kd export hands a student of its tokenizer.
        assert all(isinstance(token["id"], int) for token in row["logprobs"])
        assert all(isinstance(top["id"], int) for t in row["logprobs"] for top in t["top"])
    assert all(
        "CapitalAnswer" in reason or "cut off at max_tokens" in reason
        for reason in set_aside["reason"].to_list()
    )


def test_a_landing_stopped_between_the_seeds_and_their_quarantine_is_landed_again(
    llama_env: LlamaEnv,
) -> None:
    # Issue 42 item 4: the seeds of the new version were written, the run died before the input
    # quarantine's write. The night used to take the seeds as current and never land the version
    # again: the old version's rejects stayed, the new one's were lost for good.
    good = json.dumps({"id": "fine", "prompt": "Name a colour."})
    _write_inbox(llama_env.home, "halfway.jsonl", [good, "{old broken line"])
    settings = Settings.from_env()
    warehouse = WarehouseResource(deployment=settings)
    with dg.instance_for_test() as instance:
        assert _materialize(instance, "halfway", ["seed_prompts"]).success
        _write_inbox(llama_env.home, "halfway.jsonl", [good, "{new broken line", "{and another"])
        with armed("seeds.rows_written"):
            stopped = dg.materialize(
                batch_assets(settings),
                selection=["seed_prompts"],
                partition_key=_key("halfway"),
                resources=build_resources(settings),
                instance=instance,
                raise_on_error=False,
            )
        assert not stopped.success
        resolved = resolve_seeds_input(settings, _today(), "halfway")
        # What the night decides: the new version is not landed yet...
        assert not seeds_are_current(warehouse, resolved)
        assert _materialize(instance, "halfway", ["seed_prompts"]).success
    # ...and once landed again, its rejected lines are in quarantine, the old ones gone.
    aside = _warehouse(llama_env).read_partition("quarantine", _today(), "halfway")
    assert sorted(aside["line"].to_list()) == [2, 3]
    assert resolved.version is not None
    assert aside["input_sha256"].unique().to_list() == [resolved.version.sha256]
    assert seeds_are_current(warehouse, resolve_seeds_input(settings, _today(), "halfway"))
