"""The one Definitions object loads, validates, and draws the graph the UI shows."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from kimi_batch.definitions import build_definitions, build_resources
from kimi_batch.defs.resources import LlamaServerResource, WarehouseResource
from kimi_batch.settings import Settings
from kimi_batch_tests.support.repo import REPO_ROOT

# Its slow tests start no llama-server: they run beside the ones that do (support/slow_split.py).
pytestmark = pytest.mark.no_llama_server


@pytest.fixture(scope="module")
def defs() -> dg.Definitions:
    return build_definitions(Settings.from_env())


@pytest.mark.slow
def test_dagster_cli_validates_the_workspace_on_the_repo_instance_config(tmp_path: Path) -> None:
    shutil.copy(REPO_ROOT / "dagster.yaml", tmp_path / "dagster.yaml")
    dagster = Path(sys.executable).with_name("dagster")
    result = subprocess.run(
        [str(dagster), "definitions", "validate", "-w", "workspace.yaml"],
        cwd=REPO_ROOT,
        env={**os.environ, "DAGSTER_HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]


def test_asset_graph_reads_digest_then_seed_amplified_distilled(defs: dg.Definitions) -> None:
    graph = defs.resolve_asset_graph()
    key = dg.AssetKey
    assert graph.get(key("digest_prefill")).parent_keys == {key("system_digest")}
    assert graph.get(key("amplified_prompts")).parent_keys == {key("seed_prompts")}
    assert graph.get(key("distilled_responses")).parent_keys == {
        key("seed_prompts"),
        key("amplified_prompts"),
    }
    assert defs.resolve_job_def("batch_job") is not None
    assert {s.name for s in defs.schedules or []} == {
        "nightly_distillation_schedule",
        "table_maintenance_schedule",
    }
    assert defs.resolve_job_def("maintenance_job") is not None
    assert {s.name for s in defs.sensors or []} == {
        "inbox_sensor",
        "api_batch_sensor",
        "run_failure_alert",
        "distilled_freshness_checks",
        "morning_report",
        "night_versions_on_success",
        "night_versions_on_failure",
        "night_versions_on_canceled",
    }


def test_every_asset_has_a_description_and_a_group(defs: dg.Definitions) -> None:
    for spec in defs.resolve_all_asset_specs():
        assert spec.description, spec.key
        assert spec.group_name in {"digest", "batch", "api"}, spec.key


# Every module that builds definitions, and the entry points that import them.
_IMPORTED = (
    "kimi_batch.definitions",
    "kimi_batch.defs.partitions",
    "kimi_batch.defs.sensors",
    "kimi_batch.defs.schedules",
    "kimi_batch.defs.alerts",
    "kimi_batch.defs.assets.batch",
    "kimi_batch.defs.assets.digest",
    "kimi_batch.cli.status",
    "kimi_batch.cli",
)


def test_importing_the_code_location_reads_no_variable_and_writes_no_file(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KIMI_BATCH_")}
    # Reading either at import would fail the import (a bad zone) or create the state dir.
    env.update({"KIMI_BATCH_HOME": str(home), "KIMI_BATCH_TIMEZONE": "Not/A_Zone"})
    done = subprocess.run(
        [sys.executable, "-c", "; ".join(f"import {module}" for module in _IMPORTED)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert not home.exists()


def test_a_defs_file_dropped_into_the_folder_is_loaded(tmp_path: Path) -> None:
    # What `dg scaffold defs dagster.asset NAME.py` writes: a plain module in kimi_batch/defs/.
    # It is dropped into a copy of the project, loaded by a child process importing that copy,
    # so no other test (run in parallel) ever sees the file in the repository's folder.
    project = tmp_path / "project"
    shutil.copytree(
        REPO_ROOT / "kimi_batch",
        project / "kimi_batch",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    shutil.copy(REPO_ROOT / "pyproject.toml", project / "pyproject.toml")
    name = "dropped_asset"
    defs_folder = project / "kimi_batch" / "defs"
    (defs_folder / f"{name}.py").write_text(
        f"import dagster as dg\n\n\n@dg.asset\ndef {name}() -> None: ...\n"
    )
    code = (
        "import dagster as dg, kimi_batch.defs as folder; "
        "from kimi_batch.definitions import build_definitions; "
        "from kimi_batch.settings import Settings; "
        "loaded = build_definitions(Settings.from_env()); "
        f"print(folder.__path__[0]); print(loaded.resolve_asset_graph().has(dg.AssetKey({name!r})))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("KIMI_BATCH_")}
    env.update({"KIMI_BATCH_HOME": str(tmp_path / "home"), "PYTHONPATH": str(project)})
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    folder, found = done.stdout.strip().splitlines()[-2:]
    assert Path(folder) == defs_folder  # the copy was loaded, not the repository's package
    assert found == "True"


def test_every_step_that_may_talk_to_llama_server_is_in_the_llama_pool(
    defs: dg.Definitions,
) -> None:
    assets = [defs.get_assets_def(spec.key) for spec in defs.resolve_all_asset_specs()]
    using = {
        a.key.to_user_string(): a.op.pool for a in assets if "llama" in a.required_resource_keys
    }
    assert set(using) == {
        "system_digest",
        "digest_prefill",
        "seed_prompts",
        "amplified_prompts",
        "distilled_responses",
        "judged_answers",
        "api_batch_responses",
    }
    assert set(using.values()) == {"llama_server"}, using


def test_resources_hold_the_one_settings_and_run_config_cannot_replace_it(
    tmp_path: Path,
) -> None:
    settings = Settings.from_env().model_copy(update={"home": tmp_path / "home"})
    seen: list[Settings] = []

    @dg.asset
    def probe(llama: LlamaServerResource, warehouse: WarehouseResource) -> None:
        seen.extend([llama.settings(), warehouse.deployment])

    resources = build_resources(settings)
    assert dg.materialize([probe], resources=resources).success
    assert seen == [settings, settings]
    assert seen[0] is settings
    # The deployment is a resource dependency, not config: the launchpad cannot point it elsewhere.
    elsewhere = {"llama": {"config": {"deployment": {"llama_url": "http://evil.example"}}}}
    with pytest.raises(dg.DagsterInvalidConfigError):
        dg.materialize([probe], resources=resources, run_config={"resources": elsewhere})


def test_a_batch_api_batch_is_its_own_partition_with_no_amplification(
    defs: dg.Definitions,
) -> None:
    graph = defs.resolve_asset_graph()
    node = graph.get(dg.AssetKey("api_batch_responses"))
    assert node.parent_keys == set()
    assert isinstance(node.partitions_def, dg.DynamicPartitionsDefinition)
    assert node.partitions_def.name == "api_batch"
    job = defs.resolve_job_def("api_batch_job")
    assert job.tags["kimi_batch/uses_llama_server"] == "true"


def _load_in_a_process(
    home: Path, llama_cpus: str | None, *, started_on: set[int] | None = None
) -> subprocess.CompletedProcess[str]:
    """A process (on `started_on`, else every CPU) that loads the code location, as a code server
    or a run worker does, and prints `sorted(os.sched_getaffinity(0))` after."""
    env = {k: v for k, v in os.environ.items() if k != "KIMI_BATCH_LLAMA_CPUS"}
    env["KIMI_BATCH_HOME"] = str(home)
    if llama_cpus is not None:
        env["KIMI_BATCH_LLAMA_CPUS"] = llama_cpus
    code = (
        "import os\n"
        "from kimi_batch.definitions import defs\n"
        "defs()\n"
        "print(sorted(os.sched_getaffinity(0)))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        preexec_fn=None if started_on is None else lambda: os.sched_setaffinity(0, started_on),
    )


def _cpus_after_loading(home: Path, llama_cpus: str | None) -> str:
    return _load_in_a_process(home, llama_cpus).stdout.strip().splitlines()[-1]


def test_loading_the_code_location_moves_it_off_a_pinned_servers_cpus(tmp_path: Path) -> None:
    allowed = sorted(os.sched_getaffinity(0))
    rest = allowed[1:] or allowed  # one CPU: nothing to move to, it stays
    assert _cpus_after_loading(tmp_path, str(allowed[0])) == str(rest)


def test_an_unpinned_code_location_keeps_every_cpu(tmp_path: Path) -> None:
    assert _cpus_after_loading(tmp_path, None) == str(sorted(os.sched_getaffinity(0)))


def test_a_process_started_off_the_servers_cpus_stays_there_without_a_warning(
    tmp_path: Path,
) -> None:
    # A code server started with `taskset` on the other CPUs (or by a pinned bench): the
    # server's CPUs are not among its own, which is no reason to warn or to move.
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("needs two CPUs: one for the server, one for the rest")
    loaded = _load_in_a_process(tmp_path, str(allowed[0]), started_on={allowed[-1]})

    assert loaded.stdout.strip().splitlines()[-1] == str([allowed[-1]])
    assert "not pinned" not in loaded.stderr
