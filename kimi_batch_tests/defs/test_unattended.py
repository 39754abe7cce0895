"""The unattended path on a real instance, the real server and real files: what a night survives."""

from __future__ import annotations

import json
import os
import stat
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import polars as pl
import pytest
import yaml

from kimi_batch.definitions import batch_assets, build_resources
from kimi_batch.defs.jobs import RETRY_TAGS, STOPPED_TAG, WINDOW_TAG
from kimi_batch.defs.partitions import SOURCE_PARTITIONS_NAME
from kimi_batch.engine.ledger import Ledger
from kimi_batch.llama.factory import server_from_settings
from kimi_batch.pipeline import driver
from kimi_batch.settings import Settings
from kimi_batch.warehouse import Warehouse
from kimi_batch_tests.support.llama_server import TEST_SLOTS, LlamaEnv
from kimi_batch_tests.support.ports import free_port

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:Non-compliant tag keys:DeprecationWarning"),
]

REPO_ROOT = Path(__file__).resolve().parents[2]
QUICK: dict[str, Any] = {
    "ops": {
        "amplified_prompts": {"config": {"strategies": ["paraphrase"], "max_tokens": 24}},
        "distilled_responses": {"config": {"max_tokens": 32}},
    }
}


def _today() -> str:
    return Settings.from_env().today().isoformat()


def _inbox(home: Path, name: str, prompts: list[str]) -> Path:
    path = home / "inbox" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [json.dumps({"id": f"{path.stem}-{i}", "prompt": p}) for i, p in enumerate(prompts)]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def _run(
    instance: dg.DagsterInstance,
    source: str,
    selection: list[str] | None = None,
    *,
    run_config: dict[str, Any] | None = None,
    tags: dict[str, str] | None = None,
) -> dg.ExecuteInProcessResult:
    instance.add_dynamic_partitions(SOURCE_PARTITIONS_NAME, [source])
    config = run_config or QUICK
    return dg.materialize(
        batch_assets(Settings.from_env()),
        selection=selection,
        partition_key=dg.MultiPartitionKey({"date": _today(), "source": source}),
        resources=build_resources(Settings.from_env()),
        instance=instance,
        run_config={
            "ops": {
                op: value
                for op, value in config["ops"].items()
                if selection is None or op in selection
            }
        },
        tags=tags,
        raise_on_error=False,
    )


def _meta(result: dg.ExecuteInProcessResult, asset: str) -> dict[str, Any]:
    (event,) = result.asset_materializations_for_node(asset)
    return {key: value.value for key, value in event.metadata.items()}


def _launches(env: LlamaEnv) -> int:
    return env.server.log_path.read_text(errors="replace").count("launch_slot_: id")


def test_distillation_reads_the_landed_snapshot_after_the_inbox_file_is_gone(
    llama_env: LlamaEnv,
) -> None:
    path = _inbox(llama_env.home, "vanishing.jsonl", ["Name a primary colour.", "What is 2+2?"])
    with dg.instance_for_test() as instance:
        ingest = _run(instance, "vanishing", ["seed_prompts", "amplified_prompts"])
        assert ingest.success
        path.unlink()  # cleaned up after ingestion, before the night
        night = _run(instance, "vanishing")  # the distillation job: upstream included

    assert night.success, night.all_events
    seeds = _meta(night, "seed_prompts")
    assert seeds["read_from"] == "landed snapshot"
    assert seeds["rows"] == 2
    warehouse = Warehouse(llama_env.home / "warehouse")
    distilled = warehouse.read_partition("distilled", _today(), "vanishing")
    set_aside = warehouse.read_partition("quarantine", _today(), "vanishing").filter(
        pl.col("stage") == "distill"
    )
    variants = warehouse.read_partition("amplified", _today(), "vanishing")
    assert distilled.height + set_aside.height == 2 + variants.height
    assert warehouse.read_partition("seeds", _today(), "vanishing")["input_sha256"].n_unique() == 1
    # Readable metadata: rounded figures, units in the keys, a short sha, a summary table.
    meta = _meta(night, "distilled_responses")
    assert len(meta["digest_sha256"]) == 12
    assert meta["digest_sha256_full"].startswith(meta["digest_sha256"])
    assert meta["cache_hit_ratio"] == round(meta["cache_hit_ratio"], 3)
    assert meta["completion_tokens_per_s"] == round(meta["completion_tokens_per_s"], 1)
    assert "| tok/s |" in meta["summary"]


def test_past_the_nightly_window_the_partition_stops_and_the_next_night_finishes_it(
    llama_env: LlamaEnv,
) -> None:
    # Far more work than the window holds, on a fast idle machine too: the last 4 of 12 answers
    # of up to 64 tokens go out only once 8 are done, and 512 tokens in 3 s would be 170
    # tokens/s from SmolLM2 on 2 threads (it makes 20-40 here).
    prompts = [f"Write a short story about the number {i}." for i in range(3 * TEST_SLOTS)]
    _inbox(llama_env.home, "windowed.jsonl", prompts)
    config = {"ops": {"distilled_responses": {"config": {"max_tokens": 64, "seed": 5}}}}
    with dg.instance_for_test() as instance:
        assert _run(instance, "windowed", ["seed_prompts"]).success
        end = datetime.now(UTC) + timedelta(seconds=3)
        stopped = _run(
            instance,
            "windowed",
            ["distilled_responses"],
            run_config=config,
            tags={WINDOW_TAG: end.isoformat()},
        )
        assert not stopped.success
        failure = next(e for e in stopped.all_events if e.event_type_value == "STEP_FAILURE")
        message = str(failure.event_specific_data)
        assert "resumes next night" in message
        run = instance.get_run_by_id(stopped.run_id)
        assert run is not None
        assert run.tags[STOPPED_TAG] == "true"
        assert f"of {len(prompts)} rows done" in message

        resumed = _run(instance, "windowed", ["distilled_responses"], run_config=config)

    assert resumed.success
    meta = _meta(resumed, "distilled_responses")
    # What the window let through (on a loaded machine possibly nothing) comes from the ledger.
    assert 0 <= meta["from_ledger"] < len(prompts)
    assert meta["from_ledger"] + meta["generated"] == len(prompts)
    assert f"{meta['from_ledger']} of {len(prompts)} rows done" in message


def test_a_partition_held_by_another_run_is_left_alone(
    llama_env: LlamaEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    _inbox(llama_env.home, "contested.jsonl", ["What is a lease?"])
    monkeypatch.setattr(driver, "LEASE_WAIT_S", 1.0)
    with dg.instance_for_test() as instance:
        assert _run(instance, "contested", ["seed_prompts"]).success
        with (
            Ledger(Settings.from_env().paths.ledger_path) as ledger,
            ledger.lease(f"{_today()}|contested", "another-run"),
        ):
            before = _launches(llama_env)
            blocked = _run(instance, "contested", ["distilled_responses"])
            assert _launches(llama_env) == before  # not one request sent
        after = _run(instance, "contested", ["distilled_responses"])

    assert not blocked.success
    failure = next(e for e in blocked.all_events if e.event_type_value == "STEP_FAILURE")
    assert "being written by another run" in str(failure.event_specific_data)
    assert after.success


def test_an_output_model_outside_the_allowed_modules_is_refused(llama_env: LlamaEnv) -> None:
    _inbox(llama_env.home, "schema.jsonl", ["Anything."])
    config = {
        "ops": {"distilled_responses": {"config": {"output_model": "os.path:sep", "max_tokens": 8}}}
    }
    with dg.instance_for_test() as instance:
        assert _run(instance, "schema", ["seed_prompts"]).success
        before = _launches(llama_env)
        refused = _run(instance, "schema", ["distilled_responses"], run_config=config)

    assert not refused.success
    failure = next(e for e in refused.all_events if e.event_type_value == "STEP_FAILURE")
    assert "not in an allowed module" in str(failure.event_specific_data)
    assert _launches(llama_env) == before


def test_truncated_answers_are_never_final_and_can_be_asked_again(llama_env: LlamaEnv) -> None:
    prompts = [
        "What is the capital of France? Answer in one short sentence.",
        "What colour is the sky on a clear day? Answer in one short sentence.",
    ]
    _inbox(llama_env.home, "cutoff.jsonl", prompts)
    tight = {"ops": {"distilled_responses": {"config": {"max_tokens": 4, "temperature": 0.0}}}}
    retry = {
        "ops": {
            "distilled_responses": {
                "config": {
                    "max_tokens": 4,
                    "temperature": 0.0,
                    "retry_truncated_max_tokens": 200,
                }
            }
        }
    }
    warehouse = Warehouse(llama_env.home / "warehouse")
    with dg.instance_for_test() as instance:
        assert _run(instance, "cutoff", ["seed_prompts"]).success
        first = _run(instance, "cutoff", ["distilled_responses"], run_config=tight)
        assert first.success
        cut = warehouse.read_partition("distilled", _today(), "cutoff").height
        aside = warehouse.read_partition("quarantine", _today(), "cutoff")
        truncation = next(
            c for c in first.get_asset_check_evaluations() if c.check_name == "truncation_rate"
        )
        second = _run(instance, "cutoff", ["distilled_responses"], run_config=retry)

    truncated = aside.filter(pl.col("reason").str.contains("cut off at max_tokens")).height
    assert truncated >= 1  # four tokens rarely answer a sentence
    assert cut + truncated == len(prompts)  # no truncated answer counts as final
    assert truncation.metadata["truncated"].value == truncated
    assert second.success
    rows = warehouse.read_partition("distilled", _today(), "cutoff")
    assert rows.height == len(prompts)  # asked again with 200 tokens: every answer is whole
    assert set(rows["finish_reason"].to_list()) == {"stop"}
    assert max(rows["completion_tokens"].to_list()) > 4


def test_failed_unattended_runs_are_retried_a_bounded_number_of_times() -> None:
    config = yaml.safe_load((REPO_ROOT / "dagster.yaml").read_text())
    assert config["run_retries"] == {"enabled": True, "max_retries": 0}
    assert RETRY_TAGS["dagster/max_retries"] == "2"
    with dg.instance_for_test(overrides={"run_retries": config["run_retries"]}) as instance:
        assert instance.run_retries_enabled
        assert instance.run_retries_max_retries == 0  # runs started by hand are not retried


@pytest.fixture
def keyed_server(
    tmp_path: Path, llama_binary: Path, model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Path, str]]:
    """A resident server of its own, started from the environment with an API key."""
    key = f"kb-{uuid.uuid4().hex}"
    home = tmp_path / "keyed"
    for name, value in {
        "KIMI_BATCH_HOME": str(home),
        "KIMI_BATCH_MODEL": str(model_path),
        "KIMI_BATCH_LLAMA_SERVER": str(llama_binary),
        "KIMI_BATCH_LLAMA_PORT": str(free_port()),
        "KIMI_BATCH_LLAMA_THREADS": "2",
        "KIMI_BATCH_LLAMA_CTX": "4096",
        "KIMI_BATCH_LLAMA_PARALLEL": "2",
        "KIMI_BATCH_LLAMA_N_PREDICT": "64",
        "KIMI_BATCH_LLAMA_API_KEY": key,
    }.items():
        monkeypatch.setenv(name, value)
    server = server_from_settings(Settings.from_env(), load_timeout_s=300)
    try:
        yield home, key
    finally:
        server.stop()


def _files_holding(root: Path, secret: bytes) -> list[str]:
    return [
        str(path)
        for path in root.rglob("*")
        if path.is_file() and not path.is_symlink() and secret in path.read_bytes()
    ]


def test_the_api_key_is_nowhere_in_logs_metadata_tables_or_state(
    keyed_server: tuple[Path, str],
) -> None:
    home, key = keyed_server
    _inbox(home, "secretive.jsonl", ["Say hello.", "Say goodbye."])
    with dg.instance_for_test() as instance:
        result = _run(instance, "secretive")
        assert result.success, result.all_events
        events = instance.all_logs(result.run_id)
        assert events
        assert not [e for e in events if key in str(e)]
        metadata = [
            str(m.metadata)
            for asset in ("seed_prompts", "amplified_prompts", "distilled_responses")
            for m in result.asset_materializations_for_node(asset)
        ]
        assert not [m for m in metadata if key in m]
        assert _files_holding(Path(instance.root_directory), key.encode()) == []
    assert Warehouse(home / "warehouse").read_partition("distilled", _today(), "secretive").height
    assert _files_holding(home, key.encode()) == []  # ledger, landed, warehouse, slots, logs


def test_url_credentials_never_reach_the_endpoint_column(
    llama_env: LlamaEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = f"pw{uuid.uuid4().hex[:8]}"
    attach = llama_env.base_url.replace("http://", f"http://batch:{secret}@")
    monkeypatch.setenv("KIMI_BATCH_LLAMA_URL", attach)
    _inbox(llama_env.home, "proxied.jsonl", ["Name a fruit."])
    with dg.instance_for_test() as instance:
        result = _run(instance, "proxied", ["seed_prompts", "distilled_responses"])
        events = instance.all_logs(result.run_id)

    assert result.success
    rows = Warehouse(llama_env.home / "warehouse").read_partition("distilled", _today(), "proxied")
    quarantined = Warehouse(llama_env.home / "warehouse").read_partition(
        "quarantine", _today(), "proxied"
    )
    assert rows.height + quarantined.height == 1
    assert set(rows["endpoint"].to_list()) <= {llama_env.base_url}
    assert not [e for e in events if secret in str(e)]
    assert _files_holding(llama_env.home / "warehouse", secret.encode()) == []


def test_state_written_by_a_run_is_owner_only(llama_env: LlamaEnv) -> None:
    _inbox(llama_env.home, "private.jsonl", ["Keep this to yourself."])
    with dg.instance_for_test() as instance:
        assert _run(instance, "private", ["seed_prompts"]).success
    paths = Settings.from_env().paths
    for directory in (paths.ledger_dir, paths.landed_dir, paths.warehouse_dir, paths.slot_save_dir):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
    # The tables' files are under the owner-only warehouse folder.
    seeds_file = next((paths.warehouse_dir / "kimi_batch" / "seeds" / "data").rglob("*.parquet"))
    assert stat.S_IMODE(paths.ledger_path.stat().st_mode) & 0o077 == 0
    assert os.access(seeds_file, os.R_OK)
