"""The nightly run over many partitions, on the real llama-server and a real instance: the real
schedule's one run request executed as the daemon would, each partition written, materialized
and checked on its own, the window, a contested lease, Trino reading each partition landed, a
night that dies after landing."""

from __future__ import annotations

import json
import sqlite3
import uuid
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import polars as pl
import psycopg
import pytest

from kimi_batch.definitions import build_definitions
from kimi_batch.defs.assets import night as night_module
from kimi_batch.defs.jobs import (
    FAILED_PARTITIONS_TAG,
    NIGHT_RUN_TAG,
    NIGHTLY_JOB_NAME,
    NIGHTLY_OP_NAME,
    STOPPED_TAG,
    WINDOW_TAG,
)
from kimi_batch.defs.night_versions import PARTITION_VERSIONS_JOB
from kimi_batch.defs.partition_states import PartitionState, distill_states
from kimi_batch.defs.schedules import PARTITIONS_TAG
from kimi_batch.engine.ledger import Ledger
from kimi_batch.pipeline import AMPLIFY, DISTILL, driver
from kimi_batch.settings import Settings
from kimi_batch.warehouse import (
    TrinoConfig,
    TrinoReader,
    Warehouse,
    newest_snapshots,
    night_tag,
    open_warehouse,
)
from kimi_batch_tests.support.llama_server import TEST_SLOTS, LlamaEnv
from kimi_batch_tests.support.postgres import PostgresServer
from kimi_batch_tests.support.s3proxy import BUCKET, S3Server
from kimi_batch_tests.support.trino import TrinoServer, catalog_over

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:Non-compliant tag keys:DeprecationWarning"),
]

QUICK: dict[str, Any] = {
    "amplification": {"strategies": ["paraphrase"], "max_tokens": 24},
    "distillation": {"max_tokens": 32, "temperature": 0.0},
}
ASSETS = ("seed_prompts", "amplified_prompts", "distilled_responses")
CHECKS = ("no_duplicate_request_ids", "truncation_rate", "matches_table_schema")


def _inbox(home: Path, name: str, prompts: list[str]) -> None:
    path = home / "inbox" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [json.dumps({"id": f"{path.stem}-{i}", "prompt": p}) for i, p in enumerate(prompts)]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")


def _tick(
    instance: dg.DagsterInstance, defs: dg.Definitions, settings: Settings
) -> dg.RunRequest | None:
    """The schedule's tick at 02:00 after today: its one run request, or None (skipped)."""
    when = datetime.combine(settings.today() + timedelta(days=1), datetime.min.time())
    # Closed on the way out: the context's own instance (from the ref) must not outlive the test's.
    with dg.build_schedule_context(
        instance=instance,
        scheduled_execution_time=when.replace(hour=2, tzinfo=settings.zone),
        repository_def=defs.get_repository_def(),
    ) as context:
        data = defs.resolve_schedule_def("nightly_distillation_schedule").evaluate_tick(context)
    requests = data.run_requests or []
    assert len(requests) <= 1, "a night is one run"
    return requests[0] if requests else None


def _execute(
    instance: dg.DagsterInstance,
    defs: dg.Definitions,
    request: dg.RunRequest,
    *,
    stages: dict[str, Any] | None = None,
    tags: dict[str, str] | None = None,
) -> dg.ExecuteInProcessResult:
    """The run the daemon would launch for `request`, with quick stage configs."""
    assert request.job_name == NIGHTLY_JOB_NAME
    config = request.run_config["ops"][NIGHTLY_OP_NAME]["config"]
    run_config = {"ops": {NIGHTLY_OP_NAME: {"config": {**config, **(stages or QUICK)}}}}
    request_tags = {k: v for k, v in request.tags.items() if not k.startswith("dagster/")}
    return defs.resolve_job_def(NIGHTLY_JOB_NAME).execute_in_process(
        instance=instance,
        run_config=run_config,
        tags={**request_tags, **(tags or {})},
        raise_on_error=False,
    )


def _night_closing_in(
    seconds: float,
    instance: dg.DagsterInstance,
    defs: dg.Definitions,
    settings: Settings,
    stages: dict[str, Any],
) -> dg.ExecuteInProcessResult:
    """Tonight's run, its window ending `seconds` from now."""
    request = _tick(instance, defs, settings)
    assert request is not None
    end = datetime.now(UTC) + timedelta(seconds=seconds)
    return _execute(instance, defs, request, stages=stages, tags={WINDOW_TAG: end.isoformat()})


def _failure(result: dg.ExecuteInProcessResult) -> str:
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    return str(failure.event_specific_data)


@pytest.fixture
def night(
    llama_env: LlamaEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Settings, dg.Definitions]:
    """A state dir of its own (inbox, warehouse, ledger) on the session's real server."""
    home = tmp_path / "home"
    (home / "inbox").mkdir(parents=True)
    monkeypatch.setenv("KIMI_BATCH_HOME", str(home))
    monkeypatch.setenv("KIMI_BATCH_LLAMA_URL", llama_env.base_url)
    settings = Settings.from_env()
    return settings, build_definitions(settings)


def test_one_run_writes_materializes_and_checks_every_partition(
    llama_env: LlamaEnv, night: tuple[Settings, dg.Definitions]
) -> None:
    settings, defs = night
    sources = {"north": ["Name a primary colour.", "What is 2+2?"], "south": ["Name a planet."]}
    for name, prompts in sources.items():
        _inbox(settings.paths.home, f"{name}.jsonl", prompts)
    today = settings.today().isoformat()
    keys = [f"{today}|{name}" for name in sorted(sources)]
    with dg.instance_for_test() as instance:
        request = _tick(instance, defs, settings)
        assert request is not None
        assert request.run_key == f"nightly:{today}"
        assert request.run_config["ops"][NIGHTLY_OP_NAME]["config"]["partitions"] == keys
        assert request.tags[PARTITIONS_TAG] == "2"
        result = _execute(instance, defs, request)
        assert result.success, [e.message for e in result.all_events if e.is_failure]
        materialized = {
            asset: set(instance.get_materialized_partitions(dg.AssetKey(asset))) for asset in ASSETS
        }
        infos = instance.event_log_storage.get_asset_check_partition_info(
            [dg.AssetCheckKey(dg.AssetKey("distilled_responses"), name) for name in CHECKS]
        )
        states = distill_states(instance)
        again = _tick(instance, defs, settings)

    assert materialized == {asset: set(keys) for asset in ASSETS}
    # Each partition's own checks, evaluated and passed.
    assert {(i.check_key.name, i.partition_key) for i in infos} == {
        (name, key) for name in CHECKS for key in keys
    }
    assert all(i.latest_execution_status.value == "SUCCEEDED" for i in infos)
    assert {key: record.state for key, record in states.items()} == {
        key: PartitionState.DONE for key in keys
    }
    warehouse = Warehouse(settings.paths.warehouse_dir)
    for name, prompts in sources.items():
        variants = warehouse.read_partition("amplified", today, name)
        distilled = warehouse.read_partition("distilled", today, name)
        set_aside = warehouse.read_partition("quarantine", today, name).filter(
            pl.col("stage") == "distill"
        )
        assert set(distilled["seed_id"]) == {f"{name}-{i}" for i in range(len(prompts))}
        # Every seed and variant answered, or set aside with its reason (cut off at 32 tokens).
        assert distilled.height + set_aside.height == len(prompts) + variants.height
        assert distilled["request_id"].n_unique() == distilled.height
    assert again is None  # the night is done: the next tick skips
    # What the night published: every table's current snapshot carries the night's tag.
    tables = {snapshot.table: snapshot for snapshot in newest_snapshots(warehouse)}
    assert {"seeds", "amplified", "distilled"} <= set(tables)
    for snapshot in tables.values():
        assert snapshot.night_tag == night_tag(today)
        assert snapshot.night_snapshot_id == snapshot.snapshot_id


def test_past_the_window_the_finished_partitions_land_and_the_rest_resume(
    llama_env: LlamaEnv, night: tuple[Settings, dg.Definitions], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings, defs = night
    # The first partition is small; the second far more than the window holds.
    _inbox(settings.paths.home, "a_small.jsonl", ["What is 2+2?"])
    # 6 answers a slot of up to 64 tokens: ~40 s of generation on 2 cores against a 15 s window.
    prompts = [f"Write a short story about the number {i}." for i in range(6 * TEST_SLOTS)]
    _inbox(settings.paths.home, "b_large.jsonl", prompts)
    # The third fails for a reason of its own (another run holds it): failed, not "resumes".
    _inbox(settings.paths.home, "c_held.jsonl", ["What is a lease?"])
    monkeypatch.setattr(driver, "LEASE_WAIT_S", 1.0)
    today = settings.today().isoformat()
    distill_only = {"skip_stages": [AMPLIFY.asset], "distillation": {"max_tokens": 64, "seed": 5}}
    with dg.instance_for_test() as instance:
        with (
            Ledger(settings.paths.ledger_path) as ledger,
            ledger.lease(f"{today}|c_held", "another-run"),
        ):
            stopped = _night_closing_in(15, instance, defs, settings, distill_only)
        run = instance.get_run_by_id(stopped.run_id)
        states = distill_states(instance)
        next_night = _tick(instance, defs, settings)
        assert next_night is not None
        resumed = _execute(instance, defs, next_night, stages=distill_only)
        after = distill_states(instance)

    assert not stopped.success
    assert "resume next night" in _failure(stopped)
    assert run is not None
    assert run.tags[STOPPED_TAG] == "true"
    # Past the window a retry would send nothing: run retries leave it to the next night.
    assert run.tags["dagster/retry_on_asset_or_op_failure"] == "false"
    # The small partition's one answer came back in the window; the large one waits.
    assert states[f"{today}|a_small"].state == PartitionState.DONE
    assert states[f"{today}|b_large"].state == PartitionState.STOPPED_AT_WINDOW
    assert states[f"{today}|b_large"].run_id == stopped.run_id
    assert states[f"{today}|c_held"].state == PartitionState.FAILED
    assert json.loads(run.tags[FAILED_PARTITIONS_TAG]) == [f"{today}|c_held"]
    config = next_night.run_config["ops"][NIGHTLY_OP_NAME]["config"]
    assert config["partitions"] == [f"{today}|b_large", f"{today}|c_held"]
    assert resumed.success
    assert {key: r.state for key, r in after.items()} == {
        f"{today}|a_small": PartitionState.DONE,
        f"{today}|b_large": PartitionState.DONE,
        f"{today}|c_held": PartitionState.DONE,
    }
    warehouse = Warehouse(settings.paths.warehouse_dir)
    rows = warehouse.read_partition("distilled", today, "b_large")
    set_aside = warehouse.read_partition("quarantine", today, "b_large")
    # Every story answered (a story cut off at 64 tokens is set aside, with its reason).
    assert rows.height + set_aside.filter(pl.col("stage") == "distill").height == len(prompts)


def test_a_window_that_closes_during_amplification_still_distils_the_oldest_partition(
    llama_env: LlamaEnv, night: tuple[Settings, dg.Definitions]
) -> None:
    """Issue 26 (b): a partition's distillation starts as soon as its own variants are written,
    while the newer partition still amplifies, so the window leaves the oldest one whole."""
    settings, defs = night
    _inbox(settings.paths.home, "a_small.jsonl", ["What is 2+2?"])
    # Far more than the window holds: long questions, whose paraphrases run to the budget.
    long = "Explain in detail how the number {} appears in history, science, art and games."
    _inbox(settings.paths.home, "b_large.jsonl", [long.format(i) for i in range(16 * TEST_SLOTS)])
    small, large = (f"{settings.today().isoformat()}|{name}" for name in ("a_small", "b_large"))
    stages = {
        "amplification": {"strategies": ["paraphrase"], "max_tokens": 48},
        "distillation": {"max_tokens": 24, "temperature": 0.0},
    }
    with dg.instance_for_test() as instance:
        stopped = _night_closing_in(30, instance, defs, settings, stages)
        states = distill_states(instance)
        amplified = set(instance.get_materialized_partitions(dg.AssetKey("amplified_prompts")))
        distilled = instance.fetch_materializations(
            dg.AssetRecordsFilter(
                asset_key=dg.AssetKey("distilled_responses"), asset_partitions=[small]
            ),
            limit=1,
        ).records

    assert not stopped.success
    assert "resume next night" in _failure(stopped)
    assert states[small].state == PartitionState.DONE
    assert states[large].state == PartitionState.STOPPED_AT_WINDOW
    # The window closed while the newer partition amplified: it lands nothing of that stage ...
    assert amplified == {small}
    # ... and the oldest was distilled meanwhile, joining the run with the newer one's requests
    # in flight: the slots did not drain between its stages.
    materialization = distilled[0].asset_materialization
    assert materialization is not None
    joined = materialization.metadata["in_flight_at_start"]
    assert isinstance(joined, dg.IntMetadataValue)
    assert (joined.value or 0) > 0
    warehouse = Warehouse(settings.paths.warehouse_dir)
    ds, source = small.split("|")
    answered = warehouse.read_partition("distilled", ds, source).height
    set_aside = warehouse.read_partition("quarantine", ds, source).filter(
        pl.col("stage") == "distill"
    )
    variants = warehouse.read_partition("amplified", ds, source).height
    assert variants >= 1
    assert answered + set_aside.height == 1 + variants  # the seed and every variant: whole


def test_a_partition_held_by_another_run_is_left_out_and_the_others_land(
    llama_env: LlamaEnv, night: tuple[Settings, dg.Definitions], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings, defs = night
    _inbox(settings.paths.home, "contested.jsonl", ["What is a lease?"])
    _inbox(settings.paths.home, "free.jsonl", ["What is a ledger?"])
    monkeypatch.setattr(driver, "LEASE_WAIT_S", 1.0)
    today = settings.today().isoformat()
    with dg.instance_for_test() as instance:
        request = _tick(instance, defs, settings)
        assert request is not None
        with (
            Ledger(settings.paths.ledger_path) as ledger,
            ledger.lease(f"{today}|contested", "another-run"),
        ):
            blocked = _execute(instance, defs, request)
        materialized = set(instance.get_materialized_partitions(dg.AssetKey(ASSETS[-1])))
        states = distill_states(instance)

    assert not blocked.success
    assert f"{today}|contested: partition" in _failure(blocked)
    assert "being written by another run" in _failure(blocked)
    assert materialized == {f"{today}|free"}
    assert states[f"{today}|contested"].state == PartitionState.FAILED
    warehouse = Warehouse(settings.paths.warehouse_dir)
    assert warehouse.read_partition("distilled", today, "contested").height == 0
    answered = warehouse.read_partition("distilled", today, "free").height
    set_aside = warehouse.read_partition("quarantine", today, "free").filter(
        pl.col("stage") == "distill"
    )
    assert (
        answered + set_aside.height
        == 1 + warehouse.read_partition("amplified", today, "free").height
    )


def _trino_night(monkeypatch: pytest.MonkeyPatch, trino: TrinoServer) -> Any:
    """Settings, definitions and warehouse of a night whose Trino reads its catalog."""
    monkeypatch.setenv("KIMI_BATCH_TRINO_HOST", trino.host)
    monkeypatch.setenv("KIMI_BATCH_TRINO_PORT", str(trino.port))
    monkeypatch.setenv("KIMI_BATCH_TRINO_CATALOG", trino.catalog)
    settings = Settings.from_env()
    assert settings.paths.home == trino.home  # `night` and `home_trino`: tmp_path / "home"
    return settings, build_definitions(settings), open_warehouse(settings)


def _trino_counts(settings: Settings, tables: tuple[str, ...]) -> dict[str, int]:
    with TrinoReader(TrinoConfig.from_settings(settings)) as reader:
        return {table: reader.count(table) for table in tables}


def test_every_partition_is_readable_in_trino_once_the_night_lands_it(
    night: tuple[Settings, dg.Definitions],
    home_trino: TrinoServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings, defs, warehouse = _trino_night(monkeypatch, home_trino)
    _inbox(settings.paths.home, "east.jsonl", ["Name a river.", "Name a mountain."])
    _inbox(settings.paths.home, "west.jsonl", ["Name a desert."])
    with dg.instance_for_test() as instance:
        request = _tick(instance, defs, settings)
        assert request is not None
        result = _execute(instance, defs, request)
        assert result.success, [e.message for e in result.all_events if e.is_failure]
        materialized = [
            (e.asset_key, e.partition) for e in result.all_events if e.is_step_materialization
        ]
        checks = {
            getattr(e.event_specific_data, "check_name", None)
            for e in result.all_events
            if e.event_type_value == "ASSET_CHECK_EVALUATION"
        }
    counts = _trino_counts(settings, ("seeds", "amplified", "distilled"))

    # Each partition of each asset recorded once; no publish step, nothing pending.
    assert len(materialized) == len(set(materialized)) == 2 * len(ASSETS)
    assert "published_to_trino" not in checks
    assert counts == {table: warehouse.count(table) for table in counts}
    assert counts["seeds"] == 3


def test_a_night_that_dies_after_landing_its_seeds_leaves_them_readable_in_trino(
    night: tuple[Settings, dg.Definitions],
    home_trino: TrinoServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 26 (a), now: the seeds a killed night committed are read by Trino at once (nothing
    left to publish), and the next night keeps them."""
    settings, defs, warehouse = _trino_night(monkeypatch, home_trino)
    _inbox(settings.paths.home, "north.jsonl", ["Name a lake.", "Name a sea."])
    key = f"{settings.today().isoformat()}|north"

    def killed(*args: object, **kwargs: object) -> Any:
        raise RuntimeError("the night's process died")

    with dg.instance_for_test() as instance:
        request = _tick(instance, defs, settings)
        assert request is not None
        with monkeypatch.context() as dying:
            dying.setattr(night_module, "run_partitions", killed)  # dies in the first batch
            died = _execute(instance, defs, request)
        seeds_after_death = set(instance.get_materialized_partitions(dg.AssetKey("seed_prompts")))
        in_trino = _trino_counts(settings, ("seeds",))["seeds"]
        next_night = _tick(instance, defs, settings)
        assert next_night is not None
        resumed = _execute(instance, defs, next_night)
        assert resumed.success, [e.message for e in resumed.all_events if e.is_failure]
        kept = [
            m
            for m in resumed.asset_materializations_for_node(NIGHTLY_OP_NAME)
            if m.asset_key == dg.AssetKey("seed_prompts")
        ]

    assert not died.success
    assert seeds_after_death == {key}
    assert in_trino == warehouse.count("seeds") == 2
    assert kept == []  # the next night kept the landed seeds


@pytest.fixture
def team_deployment(
    night: tuple[Settings, dg.Definitions],
    postgres_server: PostgresServer,
    s3proxy_server: S3Server,
    monkeypatch: pytest.MonkeyPatch,
) -> dict[str, str]:
    """The night's deployment on the state a team shares: PostgreSQL and an object store."""
    deployment = {
        **s3proxy_server.env,
        "KIMI_BATCH_DATABASE_URL": postgres_server.new_database(),
        "KIMI_BATCH_WAREHOUSE": f"s3://{BUCKET}/night-{uuid.uuid4().hex[:12]}",
        "KIMI_BATCH_S3_ENDPOINT": s3proxy_server.endpoint,
        "KIMI_BATCH_S3_REGION": s3proxy_server.env["AWS_REGION"],
    }
    for name, value in deployment.items():
        monkeypatch.setenv(name, value)
    return deployment


def test_a_night_on_postgresql_and_an_object_store_lands_tables_trino_and_polars_count_alike(
    team_deployment: dict[str, str], llama_trino: TrinoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings.from_env()
    assert settings.paths.database_url is not None
    _inbox(settings.paths.home, "east.jsonl", ["Name a river.", "Name a mountain.", "   "])
    _inbox(settings.paths.home, "west.jsonl", ["Name a desert."])
    with catalog_over(llama_trino, settings) as trino:
        settings, defs, warehouse = _trino_night(monkeypatch, trino)
        with dg.instance_for_test() as instance:
            request = _tick(instance, defs, settings)
            assert request is not None
            result = _execute(instance, defs, request)
            assert result.success, [e.message for e in result.all_events if e.is_failure]
        tables = ("seeds", "amplified", "distilled", "quarantine")
        in_trino = _trino_counts(settings, tables)

    # Every table an Iceberg table on the object store, its catalog in PostgreSQL.
    assert warehouse.tables() == list(tables)
    for table in tables:
        iceberg = warehouse.iceberg_table(table)
        assert iceberg is not None
        assert iceberg.location().startswith(team_deployment["KIMI_BATCH_WAREHOUSE"])
    with psycopg.connect(team_deployment["KIMI_BATCH_DATABASE_URL"]) as connection:
        listed = connection.execute(
            "SELECT table_name FROM kimi_ledger.iceberg_tables ORDER BY table_name"
        ).fetchall()
    assert sorted(name for (name,) in listed) == sorted(tables)
    # Trino, polars (pl.scan_iceberg) and the snapshots' own counts agree.
    in_polars = {t: warehouse.scan(t).select(pl.len()).collect().item() for t in tables}
    assert in_trino == in_polars == {t: warehouse.count(t) for t in tables}
    assert in_trino["seeds"] == 3
    assert in_trino["quarantine"] >= 1  # the blank prompt, set aside with its reason
    assert all(count > 0 for count in in_trino.values()), in_trino


def test_a_version_run_past_the_window_lands_what_the_night_landed_and_the_partition_stays_done(
    llama_env: LlamaEnv, night: tuple[Settings, dg.Definitions]
) -> None:
    """The night's version runs start after it ends, past its window when it was stopped there.
    A request the night failed (so not in the ledger) could not be sent again: the version run
    failed stopped-at-window, and status named the landed partition stopped for good (the
    schedule, seeing it materialized, never asked for it again). It lands as failed now."""
    settings, defs = night
    _inbox(settings.paths.home, "versioned.jsonl", ["What is 2+2?", "What is 3+3?"])
    distill_only = {"skip_stages": [AMPLIFY.asset], "distillation": {"max_tokens": 8, "seed": 5}}
    today = settings.today().isoformat()
    key = f"{today}|versioned"
    with dg.instance_for_test() as instance:
        request = _tick(instance, defs, settings)
        assert request is not None
        landed = _execute(instance, defs, request, stages=distill_only)
        assert landed.success
        # One answer leaves the ledger, as a request the night failed never entered it.
        with closing(sqlite3.connect(settings.paths.ledger_path)) as ledger, ledger:
            (gone,) = ledger.execute("SELECT request_id FROM results LIMIT 1").fetchone()
            ledger.execute("DELETE FROM results WHERE request_id = ?", (gone,))
        past = (datetime.now(UTC) - timedelta(minutes=5)).isoformat()
        versions = defs.resolve_job_def(PARTITION_VERSIONS_JOB).execute_in_process(
            instance=instance,
            partition_key=key,
            asset_selection=[dg.AssetKey(DISTILL.asset)],
            run_config={"ops": {DISTILL.asset: {"config": distill_only["distillation"]}}},
            tags={NIGHT_RUN_TAG: landed.run_id, WINDOW_TAG: past},
            raise_on_error=False,
        )
        states = distill_states(instance)
        run = instance.get_run_by_id(versions.run_id)

    assert versions.success, [e.message for e in versions.all_events if e.is_failure]
    assert run is not None
    assert STOPPED_TAG not in run.tags
    assert states[key].state == PartitionState.DONE
    warehouse = Warehouse(settings.paths.warehouse_dir)
    answered = warehouse.read_partition("distilled", today, "versioned").height
    set_aside = warehouse.read_partition("quarantine", today, "versioned").filter(
        pl.col("stage") == "distill"
    )
    assert answered + set_aside.height == 2  # every request landed, the unsent one as failed
    reasons = set_aside["reason"].to_list()
    assert sum(r.startswith("not sent: the nightly window ended before it") for r in reasons) == 1
