"""Adding a stage is one class and one declaration: the architecture doc's "Adding a stage" code.

The doc's python block is run as it stands (so the doc cannot rot), then, with no other file
changed, the stage is in the code location: its asset with the generation checks, the batch job,
the nightly job, its table (read by Trino at once), the alerts' check states, `kimi-batch status`
and the demo. The slow test runs it on the real server: from its asset, from the nightly job, read
by a real Trino.
"""

from __future__ import annotations

import json
import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from kimi_batch.cli.demo import run_demo
from kimi_batch.cli.export import pinned_warehouse
from kimi_batch.cli.status import collect_status
from kimi_batch.definitions import batch_assets, build_definitions, build_resources
from kimi_batch.defs.alerts import build_freshness_checks
from kimi_batch.defs.jobs import NIGHTLY_JOB_NAME, NIGHTLY_OP_NAME
from kimi_batch.defs.partition_states import (
    INPUT_SHA_METADATA,
    PartitionState,
    distill_states,
    failed_checks,
    night_end_key,
    watched_checks,
)
from kimi_batch.defs.partitions import SOURCE_PARTITIONS_NAME
from kimi_batch.pipeline import (
    STAGE_DECLARATIONS,
    TRUNCATION_CHECK,
    RequestTag,
    generation_columns,
    night_end,
    nightly_stages,
    stage_of_tag,
    withdraw_stage,
)
from kimi_batch.settings import Settings
from kimi_batch.warehouse import TABLES, TrinoConfig, TrinoReader, open_warehouse
from kimi_batch_bench.busy import generating_steps
from kimi_batch_tests.support.llama_server import LlamaEnv
from kimi_batch_tests.support.results import make_result
from kimi_batch_tests.support.trino import TrinoServer

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
ASSET = "answer_summaries"
# Dagster's own multi-partition tags (`dagster/partition/date`) trip its tag-key deprecation.
_TAG_WARNING = "ignore:Non-compliant tag keys:DeprecationWarning"


def doc_stage_code() -> str:
    """The python block of the doc's "Adding a stage" section."""
    section = DOC.read_text(encoding="utf-8").split("\n## Adding a stage\n", 1)[1]
    section = section.split("\n## ", 1)[0]
    (block,) = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    return block


@pytest.fixture
def summary(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    """The doc's stage, declared by running the doc's code as a module; withdrawn afterwards."""
    module = types.ModuleType("doc_summary_stage")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    exec(compile(doc_stage_code(), str(DOC), "exec"), module.__dict__)
    try:
        yield module
    finally:
        withdraw_stage(ASSET)


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path / "home"))
    return Settings.from_env()


def test_the_doc_declares_a_stage_every_part_of_the_code_location_knows(
    summary: types.ModuleType, settings: Settings
) -> None:
    declaration = STAGE_DECLARATIONS[ASSET]
    assert declaration is summary.SUMMARY
    defs = build_definitions(settings)
    graph = defs.resolve_asset_graph()
    key = dg.AssetKey(ASSET)
    assert graph.get(key).parent_keys == {dg.AssetKey("distilled_responses")}
    checks = {check.name for check in graph.get(key).check_keys}
    assert TRUNCATION_CHECK in checks
    batch_job = defs.resolve_job_def("batch_job")
    assert key in batch_job.asset_layer.selected_asset_keys
    ingest_job = defs.resolve_job_def("ingest_job")
    assert key not in ingest_job.asset_layer.selected_asset_keys  # not declared for ingest
    assert nightly_stages()[-1] is declaration  # the night runs it last, after distillation
    assert declaration.tables == ("summaries", "quarantine")
    assert "summaries" in TABLES
    assert stage_of_tag(RequestTag(stage="summary").wire) is summary.SummaryTask
    assert dg.AssetCheckKey(key, TRUNCATION_CHECK) in watched_checks()


def test_a_stage_after_distillation_ends_the_night_for_the_schedule_freshness_and_staleness(
    summary: types.ModuleType, settings: Settings
) -> None:
    """The declaration alone moves "the night is done" past distillation: the night's end, the
    job of one partition's night, the freshness check, the partition states (staleness)."""
    declaration = STAGE_DECLARATIONS[ASSET]
    key = dg.AssetKey(ASSET)
    assert night_end() is declaration
    assert night_end_key() == key  # what the schedule asks the partitions of
    defs = build_definitions(settings)
    distillation = defs.resolve_job_def("distillation_job").asset_layer.selected_asset_keys
    assert {key, dg.AssetKey("distilled_responses"), dg.AssetKey("seed_prompts")} <= distillation
    (freshness,) = build_freshness_checks(settings)
    assert {check.asset_key for check in freshness.check_keys} == {key}

    partition = "2026-01-02|summary_src"
    with dg.instance_for_test() as instance:
        _materialized(instance, "distilled_responses", partition, "sha-a")
        assert distill_states(instance)[partition].state == PartitionState.PENDING
        _materialized(instance, ASSET, partition, "sha-a")
        assert distill_states(instance)[partition].state == PartitionState.DONE
        landed = {partition: "sha-b"}  # a newer version of the input landed since
        assert distill_states(instance, landed=landed)[partition].state == PartitionState.STALE


def _materialized(instance: dg.DagsterInstance, asset: str, partition: str, sha: str) -> None:
    instance.report_runless_asset_event(
        dg.AssetMaterialization(asset, partition=partition, metadata={INPUT_SHA_METADATA: sha})
    )


def test_the_export_reads_the_new_stages_table_and_the_bench_its_steps(
    summary: types.ModuleType, settings: Settings
) -> None:
    """The export pins (and its hf card names) every table of the warehouse, the new one with
    them; the bench counts the new stage's steps as generating steps."""
    rows = [
        summary.SummaryRow.model_validate(
            {
                **generation_columns(make_result()),
                "answer_request_id": "r1",
                "summary": "three short words",
            }
        )
    ]
    written = open_warehouse(settings).write_partition("summaries", "2026-01-02", "src", rows)
    assert pinned_warehouse(settings, None).snapshots == {"summaries": written.snapshot_id}
    assert ASSET in generating_steps()


@pytest.mark.filterwarnings(_TAG_WARNING)
def test_a_failed_check_of_the_new_stage_is_what_the_alerts_read(
    summary: types.ModuleType, settings: Settings
) -> None:
    partition = "2026-01-02|summary_src"
    with dg.instance_for_test() as instance:
        instance.report_runless_asset_event(
            dg.AssetCheckEvaluation(
                asset_key=dg.AssetKey(ASSET),
                check_name=TRUNCATION_CHECK,
                passed=False,
                partition=partition,
                metadata={"rate": 0.9},
            )
        )
        failed = failed_checks(instance, [partition])
    assert [item.describe() for item in failed] == [f"{ASSET} {TRUNCATION_CHECK} (rate 0.9)"]


@pytest.mark.slow
@pytest.mark.filterwarnings(_TAG_WARNING)
def test_the_new_stage_runs_from_its_asset_the_night_trino_status_and_the_demo(
    summary: types.ModuleType,
    llama_env: LlamaEnv,
    home_trino: TrinoServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in {
        "KIMI_BATCH_HOME": str(home_trino.home),
        "KIMI_BATCH_LLAMA_URL": llama_env.base_url,
        "KIMI_BATCH_TRINO_HOST": home_trino.host,
        "KIMI_BATCH_TRINO_PORT": str(home_trino.port),
        "KIMI_BATCH_TRINO_CATALOG": home_trino.catalog,
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    monkeypatch.delenv("KIMI_BATCH_WAREHOUSE", raising=False)
    settings = Settings.from_env()
    warehouse = open_warehouse(settings)
    inbox = settings.paths.inbox_dir
    inbox.mkdir(parents=True)
    (inbox / "summary_src.jsonl").write_text(json.dumps({"id": "j1", "prompt": "Name a planet."}))
    today = settings.today().isoformat()
    partition = f"{today}|summary_src"
    key = dg.MultiPartitionKey({"date": today, "source": "summary_src"})
    defs = build_definitions(settings)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(SOURCE_PARTITIONS_NAME, ["summary_src"])
        from_asset = dg.materialize(
            batch_assets(settings),
            partition_key=key,
            resources=build_resources(settings),
            instance=instance,
        )
        assert from_asset.success
        night = defs.resolve_job_def(NIGHTLY_JOB_NAME).execute_in_process(
            instance=instance,
            run_config={"ops": {NIGHTLY_OP_NAME: {"config": {"partitions": [partition]}}}},
        )
        assert night.success
        checked = {
            item.check_key.name: item.latest_execution_status.value
            for item in instance.event_log_storage.get_asset_check_partition_info(
                [k for k in watched_checks() if k.asset_key == dg.AssetKey(ASSET)]
            )
        }
        failed = {
            item.check for item in failed_checks(instance, [partition]) if item.asset == ASSET
        }
        materialized = set(instance.get_materialized_partitions(dg.AssetKey(ASSET)))

    summaries = warehouse.read_partition("summaries", today, "summary_src")
    distilled = warehouse.read_partition("distilled", today, "summary_src")
    set_aside = warehouse.read_partition("quarantine", today, "summary_src").filter(
        pl.col("stage") == "summary"
    )
    # Every answer summed up, or set aside with the reason; the night asked nothing again.
    assert distilled.height > 0
    assert summaries.height + set_aside.height == distilled.height
    (from_asset_run,) = from_asset.asset_materializations_for_node(ASSET)
    assert from_asset_run.metadata["generated"].value == distilled.height
    night_runs = [
        event.step_materialization_data.materialization
        for event in night.all_events
        if event.is_step_materialization and event.asset_key == dg.AssetKey(ASSET)
    ]
    assert len(night_runs) == 1
    assert night_runs[0].metadata["from_ledger"].value == distilled.height
    assert materialized == {partition}
    with TrinoReader(TrinoConfig.from_settings(settings)) as reader:
        assert reader.count("summaries") == summaries.height  # read at once: nothing published
    # Its checks were evaluated on the partition; the alerts' reading names exactly the failed.
    assert set(checked) == {TRUNCATION_CHECK}
    assert failed == {name for name, status in checked.items() if status == "FAILED"}

    status = collect_status(settings)
    assert status.ledger.by_table["summaries"] == distilled.height
    demo = run_demo(settings, console_log_level="ERROR")
    assert demo["rows_summaries"] == summaries.height
