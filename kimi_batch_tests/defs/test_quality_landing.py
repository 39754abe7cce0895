"""Two nights landed through `land_stage` (no server; the default configuration plus a benchmark
file): planted duplicates and a contaminated row end in quarantine naming what they repeat or
overlap, a rerun quarantines nothing of its own, no export carries them, `status` sums them."""

# No `from __future__ import annotations`: Dagster reads the op function's annotations.

import json
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from kimi_batch.cli.export import ExportQuery, ExportRequest, run_export
from kimi_batch.cli.status import collect_status
from kimi_batch.defs.assets.stage_asset import land_stage, record
from kimi_batch.defs.partition_states import failed_checks
from kimi_batch.defs.resources import TrinoResource, WarehouseResource
from kimi_batch.engine import Ledger
from kimi_batch.pipeline import DistillTask, HeldPartition, StagePlan
from kimi_batch.quality import rescreen_partitions
from kimi_batch.settings import Settings
from kimi_batch.warehouse import Warehouse
from kimi_batch_tests.support.quality import (
    BENCHMARK_ITEM,
    answers_to,
    benchmark_file,
    land_seeds_of,
    outcome_of,
)

STORY = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle that was "
    "sent forty years ago by her own grandmother from a ship lost at sea."
)
RECIPE = (
    "Explain step by step how to bake a loaf of sourdough bread at home with a starter, flour, "
    "water and salt, and say what can go wrong at each step."
)
NIGHTS = {
    ("2026-12-01", "north"): [STORY, RECIPE, STORY],  # the third repeats the first that night
    ("2026-12-02", "south"): [
        STORY.upper(),  # an exact repeat of north-0, once normalized
        RECIPE.replace("each step.", "each step of it."),  # a near repeat of north-1
        f"Please solve: {BENCHMARK_ITEM}",  # 13 words and more of the benchmark item
        "Name three rivers in Africa and the seas they flow into.",
    ],
}


@dataclass(frozen=True)
class Nights:
    settings: Settings
    store: Warehouse
    results: dict[tuple[str, str], dg.MaterializeResult]


def _land(
    settings: Settings, ds: str, source: str, prompts: list[str] | None = None
) -> dg.MaterializeResult:
    store = Warehouse(settings.paths.warehouse_dir)
    task = DistillTask()
    inputs = land_seeds_of(store, ds, source, prompts or NIGHTS[(ds, source)])
    results = answers_to(task, inputs, source)
    plan = StagePlan(task, ds, source, inputs, list(task.requests(inputs)), "0" * 64)
    with (
        Ledger(settings.paths.ledger_path) as ledger,
        ledger.lease(f"{ds}|{source}", "run-1") as lease,
    ):
        return land_stage(
            dg.build_op_context(),
            plan,
            HeldPartition(ledger=ledger, lease=lease),
            outcome_of(results),
            results,
            store=store,
            trino=TrinoResource(deployment=settings),
            gate=WarehouseResource(deployment=settings).quality_gate(),
        )


@pytest.fixture
def nights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Nights:
    """A fresh state dir in the default configuration, one benchmark file, two nights landed."""
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KIMI_BATCH_BENCHMARKS", str(benchmark_file(tmp_path)))
    settings = Settings.from_env()
    results = {key: _land(settings, *key) for key in NIGHTS}
    return Nights(settings, Warehouse(settings.paths.warehouse_dir), results)


def _reasons(store: Warehouse, ds: str, source: str) -> dict[str, str]:
    aside = store.read_partition("quarantine", ds, source)
    return dict(zip(aside["input_id"], aside["reason"], strict=True))


def test_repeats_across_nights_and_a_contaminated_row_are_quarantined_naming_why(
    nights: Nights,
) -> None:
    store = nights.store
    assert store.read_partition("distilled", "2026-12-01", "north")["input_id"].to_list() == [
        "north-0",
        "north-1",
    ]
    assert store.read_partition("distilled", "2026-12-02", "south")["input_id"].to_list() == [
        "south-3"
    ]
    north = _reasons(store, "2026-12-01", "north")
    assert north["north-2"].startswith("duplicate of input 'north-0' kept in 2026-12-01|north")
    south = _reasons(store, "2026-12-02", "south")
    assert south["south-0"].startswith("duplicate of input 'north-0' kept in 2026-12-01|north")
    assert south["south-0"].endswith("similarity 1.00)")
    assert south["south-1"].startswith("near_duplicate of input 'north-1' kept in 2026-12-01")
    similarity = float(south["south-1"].rsplit("similarity ", 1)[1].rstrip(")"))
    assert 0.8 <= similarity < 1.0
    assert south["south-2"].startswith(
        "contaminated: the prompt shares 13 words with benchmark bakery_eval.jsonl item 'bake-1'"
    )

    # Lineage as every output row's: the landed input version the row was built from.
    aside = store.read_partition("quarantine", "2026-12-02", "south")
    assert aside["input_sha256"].to_list() == ["0" * 64] * 3

    result = nights.results[("2026-12-02", "south")]
    metadata = {
        name: getattr(value, "value", value) for name, value in (result.metadata or {}).items()
    }
    assert (metadata["rows"], metadata["quarantined"]) == (1, 3)
    # Dagster's standard keys: the partition's rows, the whole table's (both nights), the file.
    assert metadata["dagster/partition_row_count"] == 1
    assert metadata["dagster/row_count"] == store.count("distilled") == 3
    assert str(metadata["dagster/table_name"]).endswith(".distilled")
    # The Iceberg table's location, and the snapshot its commit made current.
    assert metadata["dagster/uri"] == store.spec.warehouse + "/kimi_batch/distilled"
    assert int(str(metadata["snapshot_id"])) == store.snapshot_id("distilled")
    schema = metadata["dagster/column_schema"]
    assert isinstance(schema, dg.TableSchema)
    assert [column.name for column in schema.columns][-2:] == ["ds", "source"]
    assert all(
        check.metadata["dagster/table_name"].value == metadata["dagster/table_name"]
        for check in result.check_results or ()
    )
    assert (metadata["duplicates"], metadata["near_duplicates"]) == (1, 1)
    assert (metadata["contaminated"], metadata["contamination_rate"]) == (1, 0.25)
    checks = {check.check_name: check for check in result.check_results or ()}
    assert not checks["benchmark_contamination"].passed  # 25% is above the default 1%
    assert checks["duplicate_rate"].passed  # half the rows: a warning only above that
    assert checks["duplicate_rate"].severity == dg.AssetCheckSeverity.WARN
    north_checks = nights.results[("2026-12-01", "north")].check_results or ()
    assert all(check.passed for check in north_checks)


def test_a_rerun_of_a_night_quarantines_nothing_of_its_own(nights: Nights) -> None:
    before = {
        table: nights.store.read_partition(table, "2026-12-02", "south")
        for table in ("distilled", "quarantine")
    }
    _land(nights.settings, "2026-12-02", "south")  # the same rows, the same request ids
    _land(nights.settings, "2026-12-01", "north")
    for table, rows in before.items():
        assert nights.store.read_partition(table, "2026-12-02", "south").equals(rows), table
    assert nights.store.read_partition("distilled", "2026-12-01", "north").height == 2


def test_a_night_landed_with_the_gate_off_takes_its_rows_out_of_the_index(
    nights: Nights, monkeypatch: pytest.MonkeyPatch
) -> None:
    """north lands again without its story while duplicates are off and no benchmark is set:
    south's repeats of north's rows are marked to be screened again, and a later copy of the
    story is no repeat of a row that no longer exists."""
    monkeypatch.setenv("KIMI_BATCH_DEDUP", "off")
    monkeypatch.delenv("KIMI_BATCH_BENCHMARKS")
    off = Settings.from_env()
    assert not WarehouseResource(deployment=off).quality_gate().screens(DistillTask())
    _land(off, "2026-12-01", "north", ["What is the tallest mountain in Africa?"])
    assert rescreen_partitions(nights.settings.paths.dedup_state) == [("2026-12-02", "south")]
    _land(nights.settings, "2026-12-03", "east", [STORY])
    assert nights.store.read_partition("distilled", "2026-12-03", "east").height == 1


def test_no_export_carries_a_quarantined_answer(nights: Nights, tmp_path: Path) -> None:
    everything = ExportRequest(fmt="chat", out=tmp_path / "all.jsonl", no_system=True)
    chat = run_export(nights.settings, everything)
    lines = [json.loads(line) for line in chat.read_text().splitlines()]
    answers = [line["messages"][-1]["content"] for line in lines]
    assert answers == [
        "The answer to north-0.",
        "The answer to north-1.",
        "The answer to south-3.",
    ]
    batch = run_export(
        nights.settings,
        ExportRequest(
            fmt="openai-batch", out=tmp_path / "south.jsonl", query=ExportQuery(source="south")
        ),
    )
    by_id = {line["custom_id"]: line for line in map(json.loads, batch.read_text().splitlines())}
    assert by_id["south-3"]["response"]["body"]["choices"][0]["message"]["content"] == (
        "The answer to south-3."
    )
    for set_aside in ("south-0", "south-1", "south-2"):  # error lines with the reason, no answer
        assert by_id[set_aside]["response"] is None
        assert by_id[set_aside]["error"]["code"] == "quarantined"


def test_status_sums_what_the_gate_set_aside(nights: Nights) -> None:
    quality = collect_status(nights.settings).quality
    assert quality.dedup
    assert quality.indexed == 3  # north-0, north-1, south-3
    assert (quality.duplicates, quality.near_duplicates, quality.contaminated) == (2, 1, 1)
    assert quality.benchmarks == ["bakery_eval.jsonl"]
    assert quality.error is None
    gate_rows = nights.store.read_table("quarantine").filter(pl.col("stage") == "distill")
    assert gate_rows.height == 4


def test_the_failed_contamination_check_is_what_the_morning_alert_reads(nights: Nights) -> None:
    """Recorded as the night records a landed partition, on a real instance."""
    result = nights.results[("2026-12-02", "south")]

    @dg.op
    def lands(context: dg.OpExecutionContext) -> None:
        record(context, dg.AssetKey("distilled_responses"), "2026-12-02|south", result)

    @dg.job
    def night() -> None:
        lands()

    with dg.instance_for_test() as instance:
        assert night.execute_in_process(instance=instance).success
        failed = failed_checks(instance)
    assert [(item.asset, item.check, item.partition, item.reason) for item in failed] == [
        ("distilled_responses", "benchmark_contamination", "2026-12-02|south", "rate 0.25")
    ]
