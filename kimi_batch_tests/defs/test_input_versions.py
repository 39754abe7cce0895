"""The day-2 rewrite story through Dagster, on the real llama-server and a real instance.

A producer writes `story.jsonl` on day 1 and new content under the same name on day 2. The real
inbox sensor lands each version and runs `ingest_job`; the real nightly schedule asks for the
night's one `nightly_job` run and it executes on the same instance (what the daemons do with a
tick's request). After day 2's night every `distilled` row carries day 2's sha, day 1's rows are
gone from the table (their answers stay in the ledger), and `kimi-batch status` showed the
partition stale in between.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import polars as pl
import pytest
from dagster_graphql.test.utils import define_out_of_process_workspace, execute_dagster_graphql

from kimi_batch.definitions import build_definitions
from kimi_batch.defs.jobs import NIGHTLY_JOB_NAME, NIGHTLY_OP_NAME, nightly_run_config
from kimi_batch.defs.night_versions import PARTITION_VERSIONS_JOB
from kimi_batch.engine import row_request_id
from kimi_batch.inputs import Landing
from kimi_batch.settings import Settings
from kimi_batch.warehouse import Warehouse
from kimi_batch_tests.support.llama_server import LlamaEnv
from kimi_batch_tests.support.repo import REPO_ROOT

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:Non-compliant tag keys:DeprecationWarning"),
]

QUICK_AMPLIFY: dict[str, Any] = {"strategies": ["paraphrase"], "max_tokens": 24}
QUICK_DISTILL: dict[str, Any] = {"max_tokens": 48, "temperature": 0.0}
QUICK: dict[str, Any] = {
    "ops": {
        "amplified_prompts": {"config": QUICK_AMPLIFY},
        "distilled_responses": {"config": QUICK_DISTILL},
    }
}
DAY_1 = ["Name a primary colour.", "What is 2+2?", "Name a planet."]
DAY_2 = ["Name a primary colour.", "What is 2+2?", "Name an ocean."]  # one row replaced


def _write(inbox: Path, prompts: list[str], age_s: float) -> None:
    rows = [json.dumps({"id": f"story-{i}", "prompt": p}) for i, p in enumerate(prompts)]
    path = inbox / "story.jsonl"
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    settled = time.time() - age_s  # older than the sensor's settle time
    os.utime(path, (settled, settled))


class Daemons:
    """Per tick what the sensor and schedule daemons do: partitions, cursor, runs executed."""

    def __init__(self, instance: dg.DagsterInstance, settings: Settings) -> None:
        self.instance = instance
        self.cursor: str | None = None
        self.defs = build_definitions(settings)

    def _execute(self, job_name: str, request: dg.RunRequest) -> dg.ExecuteInProcessResult:
        job = self.defs.resolve_job_def(job_name)
        tags = {k: v for k, v in request.tags.items() if not k.startswith("dagster/")}
        result = job.execute_in_process(
            instance=self.instance,
            partition_key=request.partition_key,
            run_config={
                "ops": {
                    k: v
                    for k, v in QUICK["ops"].items()
                    if job_name != "ingest_job" or k == "amplified_prompts"
                }
            },
            tags=tags,
            raise_on_error=False,
        )
        assert result.success, [e.message for e in result.all_events if e.is_failure]
        return result

    def sensor_tick(self) -> list[dg.ExecuteInProcessResult]:
        inbox_sensor = self.defs.resolve_sensor_def("inbox_sensor")
        context = dg.build_sensor_context(
            instance=self.instance,
            instance_ref=self.instance.get_ref(),
            cursor=self.cursor,
            definitions=self.defs,
            sensor_name=inbox_sensor.name,
        )
        data = inbox_sensor.evaluate_tick(context)
        for request in data.dynamic_partitions_requests or []:
            assert isinstance(request, dg.AddDynamicPartitionsRequest)
            self.instance.add_dynamic_partitions(
                request.partitions_def_name, list(request.partition_keys)
            )
        self.cursor = data.cursor
        return [self._execute("ingest_job", r) for r in data.run_requests or []]

    def schedule_tick(self, when: datetime) -> list[dg.ExecuteInProcessResult]:
        """The night's one `nightly_job` run (none when the tick skips), with quick stages."""
        schedule = self.defs.resolve_schedule_def("nightly_distillation_schedule")
        # Closed before the runs: the context's own instance must not outlive the test's.
        with dg.build_schedule_context(
            instance=self.instance,
            scheduled_execution_time=when,
            repository_def=self.defs.get_repository_def(),
        ) as context:
            requests = schedule.evaluate_tick(context).run_requests or []
        results = []
        for request in requests:
            assert request.job_name == NIGHTLY_JOB_NAME
            config = request.run_config["ops"][NIGHTLY_OP_NAME]["config"]
            stages = {"amplification": QUICK_AMPLIFY, "distillation": QUICK_DISTILL}
            tags = {k: v for k, v in request.tags.items() if not k.startswith("dagster/")}
            result = self.defs.resolve_job_def(NIGHTLY_JOB_NAME).execute_in_process(
                instance=self.instance,
                run_config=nightly_run_config(config["partitions"], **stages),
                tags=tags,
                raise_on_error=False,
            )
            assert result.success, [e.message for e in result.all_events if e.is_failure]
            results.append(result)
            self._versions(result)
        return results

    def _versions(self, night: dg.ExecuteInProcessResult) -> None:
        """What the night's run-status sensor asks once it succeeded: each partition's version
        run (its assets over it, from the ledger), executed."""
        sensor = self.defs.resolve_sensor_def("night_versions_on_success")
        assert isinstance(sensor, dg.RunStatusSensorDefinition)
        context = dg.build_run_status_sensor_context(
            sensor_name=sensor.name,
            dagster_event=night.get_run_success_event(),
            dagster_instance=self.instance,
            dagster_run=night.dagster_run,
        )
        requests = sensor(context)
        assert isinstance(requests, list)
        job = self.defs.resolve_job_def(PARTITION_VERSIONS_JOB)
        for request in requests:
            result = job.execute_in_process(
                instance=self.instance,
                partition_key=request.partition_key,
                asset_selection=request.asset_selection,
                run_config=request.run_config,
                tags=request.tags,
                raise_on_error=False,
            )
            assert result.success, [e.message for e in result.all_events if e.is_failure]

    def asset_run(self, job_name: str, key: str) -> None:
        """A run of `job_name` over partition `key`, as the UI's launchpad starts one."""
        self._execute(job_name, dg.RunRequest(partition_key=key))


def _materialization(result: dg.ExecuteInProcessResult, asset: str) -> dg.AssetMaterialization:
    """The run's one materialization of `asset`: the night op logs every asset's on its node."""
    (found,) = [
        m
        for m in result.asset_materializations_for_node(NIGHTLY_OP_NAME)
        if m.asset_key == dg.AssetKey(asset)
    ]
    return found


def _status() -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "kimi_batch.cli", "status", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["partitions"]


@pytest.fixture
def home(llama_env: LlamaEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A state dir of its own (its own inbox and instance) on the session's real server."""
    home = tmp_path / "home"
    (home / "inbox").mkdir(parents=True)
    (home / "dagster").mkdir()
    shutil.copy(REPO_ROOT / "dagster.yaml", home / "dagster" / "dagster.yaml")
    monkeypatch.setenv("KIMI_BATCH_HOME", str(home))
    monkeypatch.setenv("KIMI_BATCH_LLAMA_URL", llama_env.base_url)
    return home


def test_a_rewritten_input_is_distilled_again_and_only_its_new_rows_are_generated(
    home: Path,
) -> None:
    settings = Settings.from_env()
    today = settings.today()
    night_1 = datetime.combine(today + timedelta(days=1), datetime.min.time(), settings.zone)
    night_2 = night_1 + timedelta(days=1)
    key = f"{today.isoformat()}|story"
    warehouse = Warehouse(settings.paths.warehouse_dir)
    instance = dg.DagsterInstance.from_config(str(home / "dagster"))
    try:
        daemons = Daemons(instance, settings)
        _write(home / "inbox", DAY_1, age_s=120)
        assert len(daemons.sensor_tick()) == 1  # day 1 lands, ingest runs
        (first_night,) = daemons.schedule_tick(night_1.replace(hour=2))
        day_1 = warehouse.read_partition("distilled", today, "story")
        with Landing(settings.paths) as landing:
            sha_1 = landing.current(today.isoformat(), "story").sha256  # type: ignore[union-attr]

        _write(home / "inbox", DAY_2, age_s=60)  # day 2: same name, new content
        (ingest,) = daemons.sensor_tick()
        with Landing(settings.paths) as landing:
            sha_2 = landing.current(today.isoformat(), "story").sha256  # type: ignore[union-attr]
        between = _status()
        (night,) = daemons.schedule_tick(night_2.replace(hour=2))
        after = _status()
        distilled = _materialization(night, "distilled_responses")
        day_1_distilled = _materialization(first_night, "distilled_responses")
        seeds = ingest.asset_materializations_for_node("seed_prompts")[0]
        night_landed = [
            m
            for m in night.asset_materializations_for_node(NIGHTLY_OP_NAME)
            if m.asset_key == dg.AssetKey("seed_prompts")
        ]
    finally:
        instance.dispose()

    assert sha_1 != sha_2
    # The day's ingest landed day 2's seeds: the night kept them, it did not land them again.
    assert night_landed == []
    assert set(day_1["input_sha256"].to_list()) == {sha_1}
    # In between: seeds are day 2, distilled still day 1: status says stale, by key.
    assert key in between["keys"]["stale"]
    assert between["stale"] == 1
    assert key not in {k for keys in after["keys"].values() for k in keys}
    assert after["done"] == 1
    # After night 2: every row of every table of the partition carries day 2's sha.
    rows = warehouse.read_partition("distilled", today, "story")
    assert rows.height > 0
    assert set(rows["input_sha256"].to_list()) == {sha_2}
    for table in ("seeds", "amplified"):
        assert set(warehouse.read_partition(table, today, "story")["input_sha256"]) == {sha_2}
    quarantine = warehouse.read_partition("quarantine", today, "story")
    assert set(quarantine["input_sha256"].drop_nulls().to_list()) <= {sha_2}
    # Day 1's replaced row (seed story-2, now another question) and its variants' answers are
    # gone from the table, but still in the ledger.
    gone = day_1.filter(pl.col("seed_id") == "story-2")["request_id"].to_list()
    assert gone
    assert not set(gone) & set(rows["request_id"].to_list())
    # The ledger is keyed by content key; a row's request_id is row_request_id(key, input_id).
    with closing(sqlite3.connect(settings.paths.ledger_path)) as db:
        in_ledger = {
            row_request_id(key, input_id)
            for key, input_id in db.execute("SELECT request_id, input_id FROM results")
        }
    assert set(gone) <= in_ledger
    # Unchanged rows came from the ledger: only the new rows were generated.
    from_ledger = distilled.metadata["from_ledger"].value
    assert isinstance(from_ledger, int)
    assert from_ledger > 0
    assert distilled.metadata["input_sha256"].value == sha_2
    assert day_1_distilled.metadata["input_sha256"].value == sha_1
    # Dagster's own lineage: the landed sha is seed_prompts' data version (distilled's provenance
    # of it, which the night's run does not record yet: the test below).
    assert seeds.tags is not None
    assert seeds.tags["dagster/data_version"] == sha_2


_STALENESS = """
query Staleness($key: AssetKeyInput!, $partition: String!) {
  assetNodeOrError(assetKey: $key) {
    ... on AssetNode {
      staleStatus(partition: $partition)
      dataVersion(partition: $partition)
      staleCauses(partition: $partition) { reason }
    }
  }
}
"""


class _Staleness:
    """Partitions' staleness as the UI reads it: Dagster's GraphQL over the code location that
    `workspace.yaml` loads (one code server for the test), on this instance."""

    def __init__(self, instance: dg.DagsterInstance) -> None:
        path = str(REPO_ROOT / "workspace.yaml")
        self._workspace = define_out_of_process_workspace(path, None, instance)

    def __enter__(self) -> _Staleness:
        self._workspace.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._workspace.__exit__(None, None, None)

    def node(self, asset: str, partition: str) -> dict[str, Any]:
        """Its staleness (FRESH, STALE or MISSING), data version and stale causes, read in a
        request of its own (nothing cached between)."""
        result = execute_dagster_graphql(
            self._workspace.create_request_context(),
            _STALENESS,
            {"key": {"path": [asset]}, "partition": partition},
        )
        assert not result.errors, result.errors
        return result.data["assetNodeOrError"]

    def status(self, asset: str, partition: str) -> str:
        return self.node(asset, partition)["staleStatus"]


def test_the_night_records_the_version_it_consumed_and_dagster_sees_a_rewrite_stale(
    home: Path,
) -> None:
    settings = Settings.from_env()
    today = settings.today()
    night = datetime.combine(today + timedelta(days=1), datetime.min.time(), settings.zone)
    key = f"{today.isoformat()}|story"
    instance = dg.DagsterInstance.from_config(str(home / "dagster"))
    try:
        daemons = Daemons(instance, settings)
        _write(home / "inbox", DAY_1[:1], age_s=120)
        (ingest,) = daemons.sensor_tick()
        (run,) = daemons.schedule_tick(night.replace(hour=2))
        distilled = _materialization(run, "distilled_responses")
        seeds = ingest.asset_materializations_for_node("seed_prompts")[0]
        with _Staleness(instance) as staleness:
            after_night = staleness.node("distilled_responses", key)
            daemons.asset_run("distillation_job", key)  # the same input, built by its assets
            asset_built = staleness.node("distilled_responses", key)
            _write(home / "inbox", ["Name a moon."], age_s=60)  # seeds rewritten
            daemons.sensor_tick()
            after_rewrite = staleness.node("distilled_responses", key)
            daemons.schedule_tick((night + timedelta(days=1)).replace(hour=2))
            after_next_night = staleness.node("distilled_responses", key)
    finally:
        instance.dispose()

    # The version it consumed, as `status` reads it: the seeds' landed sha.
    assert distilled.metadata["input_sha256"] == seeds.metadata["input_sha256"]
    # Dagster's own staleness of the night's partitions: fresh after the night, stale once the
    # seeds are rewritten (a new data version of its input, read from its provenance, not a
    # newer timestamp), fresh again after the next night distilled them.
    states = [n["staleStatus"] for n in (after_night, asset_built, after_rewrite, after_next_night)]
    assert states == ["FRESH", "FRESH", "STALE", "FRESH"]
    assert after_rewrite["staleCauses"]
    assert {c["reason"] for c in after_rewrite["staleCauses"]} == {"has a new data version"}
    # The night-built partition's data version is the asset-built one's for the same input,
    # and another one's once the input changed.
    assert after_night["dataVersion"] is not None
    assert after_night["dataVersion"] == asset_built["dataVersion"]
    assert after_next_night["dataVersion"] not in (None, after_night["dataVersion"])


def _evaluate(daemons: Daemons, when: datetime) -> tuple[list[str], str | None]:
    """The partitions the nightly schedule asks for at `when` (no run), and its skip reason."""
    with dg.build_schedule_context(
        instance=daemons.instance,
        scheduled_execution_time=when,
        repository_def=daemons.defs.get_repository_def(),
    ) as context:
        schedule = daemons.defs.resolve_schedule_def("nightly_distillation_schedule")
        data = schedule.evaluate_tick(context)
    return [
        key
        for request in data.run_requests or []
        for key in request.run_config["ops"][NIGHTLY_OP_NAME]["config"]["partitions"]
    ], data.skip_message


def _prompts(rows: pl.DataFrame) -> set[str]:
    return set(rows["prompt"].to_list())


def test_with_the_sensor_stopped_the_night_rebuilds_a_rewritten_then_reverted_input(
    home: Path,
) -> None:
    """A -> B -> A under one name, the inbox sensor never ticking: each next night lands the
    file's new version, asks for its partition and rebuilds it from that version alone."""
    settings = Settings.from_env()
    today = settings.today()
    night_1 = datetime.combine(today + timedelta(days=1), datetime.min.time(), settings.zone)
    nights = [night_1.replace(hour=2) + timedelta(days=n) for n in range(3)]
    key = f"{today.isoformat()}|story"
    warehouse = Warehouse(settings.paths.warehouse_dir)
    instance = dg.DagsterInstance.from_config(str(home / "dagster"))
    try:
        daemons = Daemons(instance, settings)
        _write(home / "inbox", DAY_1, age_s=180)
        (run_1,) = daemons.schedule_tick(nights[0])
        a_rows = warehouse.read_partition("distilled", today, "story")
        seeds_a = warehouse.read_partition("seeds", today, "story")

        _write(home / "inbox", DAY_2, age_s=120)  # B: same name, one row replaced
        asked_b, _ = _evaluate(daemons, nights[1])
        between = _status()
        (run_2,) = daemons.schedule_tick(nights[1])
        b_rows = warehouse.read_partition("distilled", today, "story")
        seeds_b = warehouse.read_partition("seeds", today, "story")

        _write(home / "inbox", DAY_1, age_s=60)  # and back to A
        asked_a, _ = _evaluate(daemons, nights[2])
        (run_3,) = daemons.schedule_tick(nights[2])
        again_rows = warehouse.read_partition("distilled", today, "story")
        seeds_again = warehouse.read_partition("seeds", today, "story")
        after, skip = _evaluate(daemons, nights[2] + timedelta(days=1))
        with Landing(settings.paths) as landing:
            current = landing.current(today.isoformat(), "story")
    finally:
        instance.dispose()

    sha_a, sha_b = (set(s["input_sha256"].to_list()) for s in (seeds_a, seeds_b))
    assert len(sha_a) == len(sha_b) == 1
    assert sha_a != sha_b
    assert (asked_b, asked_a) == ([key], [key])
    assert key in between["keys"]["stale"]  # status saw the rewrite before the night did
    for rows, seeds, sha in ((b_rows, seeds_b, sha_b), (again_rows, seeds_again, sha_a)):
        assert rows.height > 0
        assert set(rows["input_sha256"].to_list()) == sha
        assert set(rows["seed_id"].to_list()) <= set(seeds["input_id"].to_list())
    # B's night: the row that left the file is gone; A's night: it is back, B's new one gone.
    assert "Name a planet." in _prompts(seeds_a) - _prompts(seeds_b)
    assert _prompts(seeds_again) == set(DAY_1)
    gone = set(a_rows.filter(pl.col("seed_id") == "story-2")["request_id"].to_list())
    assert gone
    assert not gone & set(b_rows["request_id"].to_list())
    for run in (run_1, run_2, run_3):
        distilled = _materialization(run, "distilled_responses")
        assert distilled.metadata["input_sha256"].value in sha_a | sha_b
    assert _materialization(run_3, "distilled_responses").metadata["input_sha256"].value in sha_a
    assert current is not None
    assert {current.sha256} == sha_a
    assert (after, skip) == (
        [],
        f"every partition up to {nights[2].date().isoformat()} is distilled",
    )


def test_a_file_of_only_bad_lines_is_consumed_once_and_not_asked_for_again(home: Path) -> None:
    settings = Settings.from_env()
    today = settings.today()
    night = datetime.combine(today + timedelta(days=1), datetime.min.time(), settings.zone)
    path = home / "inbox" / "bad.jsonl"
    path.write_text('not json\n{"id": "no-prompt"}\n', encoding="utf-8")
    settled = time.time() - 120
    os.utime(path, (settled, settled))
    warehouse = Warehouse(settings.paths.warehouse_dir)
    instance = dg.DagsterInstance.from_config(str(home / "dagster"))
    try:
        daemons = Daemons(instance, settings)
        (run,) = daemons.schedule_tick(night.replace(hour=2))
        next_night, skip = _evaluate(daemons, night.replace(hour=2) + timedelta(days=1))
    finally:
        instance.dispose()

    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    distilled = _materialization(run, "distilled_responses")
    assert distilled.metadata["input_sha256"].value == sha  # consumed: the file's version
    assert warehouse.read_partition("distilled", today, "bad").height == 0
    quarantine = warehouse.read_partition("quarantine", today, "bad")
    assert quarantine.filter(pl.col("stage") == "input").height == 2
    assert set(quarantine["input_sha256"].to_list()) == {sha}
    assert next_night == []
    assert skip is not None
    assert skip.startswith("every partition up to")
