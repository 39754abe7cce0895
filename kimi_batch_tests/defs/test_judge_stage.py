"""The judge stage: off by default (neither the night nor batch_job runs it, its asset is there);
switched on, the night grades every answer on the real server and `judged` lands in Trino."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from kimi_batch.definitions import batch_assets, build_definitions
from kimi_batch.defs.jobs import NIGHTLY_JOB_NAME, NIGHTLY_OP_NAME
from kimi_batch.pipeline import DISTILL, JUDGE, nightly_stages
from kimi_batch.settings import Settings
from kimi_batch.warehouse import TrinoConfig, TrinoReader, open_warehouse
from kimi_batch_tests.support.llama_server import LlamaEnv
from kimi_batch_tests.support.trino import TrinoServer

_TAG_WARNING = "ignore:Non-compliant tag keys:DeprecationWarning"


def _settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **env: str) -> Settings:
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path / "home"))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return Settings.from_env()


def test_by_default_the_judge_is_in_the_code_location_but_not_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KIMI_BATCH_JUDGE_NIGHTLY", raising=False)
    settings = _settings(tmp_path, monkeypatch)
    defs = build_definitions(settings)
    node = defs.resolve_asset_graph().get(dg.AssetKey(JUDGE.asset))
    assert node.parent_keys == {dg.AssetKey(DISTILL.asset)}
    assert "truncation_rate" in {check.name for check in node.check_keys}
    assert (
        dg.AssetKey(JUDGE.asset)
        not in defs.resolve_job_def("batch_job").asset_layer.selected_asset_keys
    )
    assert (
        dg.AssetKey(DISTILL.asset)
        in defs.resolve_job_def("batch_job").asset_layer.selected_asset_keys
    )
    assert JUDGE not in nightly_stages(settings)
    assert DISTILL in nightly_stages(settings)
    # "Everything" (the demo, the bench's pipeline run) is the stages switched on.
    everything = {asset.key for asset in batch_assets(settings)}
    assert dg.AssetKey(DISTILL.asset) in everything
    assert dg.AssetKey(JUDGE.asset) not in everything


def test_switched_on_the_night_runs_it_after_distillation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = _settings(tmp_path, monkeypatch, KIMI_BATCH_JUDGE_NIGHTLY="on")
    stages = nightly_stages(settings)
    assert stages.index(JUDGE) > stages.index(DISTILL)
    assert dg.AssetKey(JUDGE.asset) in {asset.key for asset in batch_assets(settings)}


@pytest.mark.slow
@pytest.mark.filterwarnings(_TAG_WARNING)
def test_the_night_grades_every_answer_and_the_judged_table_lands_in_trino(
    llama_env: LlamaEnv,
    home_trino: TrinoServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = _settings(
        tmp_path,
        monkeypatch,
        KIMI_BATCH_JUDGE_NIGHTLY="on",
        KIMI_BATCH_LLAMA_URL=llama_env.base_url,
        KIMI_BATCH_TRINO_HOST=home_trino.host,
        KIMI_BATCH_TRINO_PORT=str(home_trino.port),
        KIMI_BATCH_TRINO_CATALOG=home_trino.catalog,
    )
    warehouse = open_warehouse(settings)
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    inbox = settings.paths.inbox_dir
    inbox.mkdir(parents=True)
    prompts = ["Name a planet.", "What is 2 + 2?"]
    (inbox / "graded.jsonl").write_text(
        "".join(json.dumps({"id": f"g{i}", "prompt": p}) + "\n" for i, p in enumerate(prompts))
    )
    today = settings.today().isoformat()
    partition = f"{today}|graded"
    defs = build_definitions(settings)
    quick = {"distillation": {"max_tokens": 24, "temperature": 0.0}}
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("source", ["graded"])
        night = defs.resolve_job_def(NIGHTLY_JOB_NAME).execute_in_process(
            instance=instance,
            run_config={
                "ops": {
                    NIGHTLY_OP_NAME: {
                        "config": {
                            "partitions": [partition],
                            "skip_stages": ["amplified_prompts"],
                            **quick,
                        }
                    }
                }
            },
        )
        assert night.success
        materialized = set(instance.get_materialized_partitions(dg.AssetKey(JUDGE.asset)))

    distilled = warehouse.read_partition("distilled", today, "graded")
    judged = warehouse.read_partition("judged", today, "graded")
    set_aside = warehouse.read_partition("quarantine", today, "graded").filter(
        pl.col("stage") == "judge"
    )
    assert distilled.height > 0
    # Every answer graded once, or set aside with the reason: nothing lost, nothing twice.
    assert judged.height + set_aside.height == distilled.height
    assert set(judged["answer_request_id"]) <= set(distilled["request_id"])
    assert judged["answer_request_id"].n_unique() == judged.height
    assert judged["score"].is_between(1, 10).all()
    assert materialized == {partition}
    (materialization,) = [
        event.step_materialization_data.materialization
        for event in night.all_events
        if event.is_step_materialization and event.asset_key == dg.AssetKey(JUDGE.asset)
    ]
    scores = [materialization.metadata[f"score_{n}"].value for n in range(1, 11)]
    assert sum(float(str(count)) for count in scores) == judged.height
    with TrinoReader(TrinoConfig.from_settings(settings)) as reader:
        assert reader.count("judged") == judged.height
