"""`dg` (dagster-dg-cli) loads the project from pyproject's [tool.dg], as Dagster users expect.

Run from the repository root like a user would, without DAGSTER_HOME: dg then makes a temporary
instance from ./dagster.yaml, which must therefore not need DAGSTER_HOME either.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from kimi_batch_tests.support.repo import REPO_ROOT

# Its slow tests start no llama-server: they run beside the ones that do (support/slow_split.py).
pytestmark = pytest.mark.no_llama_server

DG = Path(sys.executable).parent / "dg"


def _dg(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "KIMI_BATCH_HOME": str(tmp_path / "home"),
        # dg compares the active environment with the project's; this is the one running us.
        "VIRTUAL_ENV": sys.prefix,
    }
    env.pop("DAGSTER_HOME", None)
    return subprocess.run(
        [str(DG), *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture(scope="module")
def listed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, object]]]:
    result = _dg(tmp_path_factory.mktemp("dg"), "list", "defs", "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_dg_check_defs_passes(tmp_path: Path) -> None:
    result = _dg(tmp_path, "check", "defs")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "All definitions loaded successfully" in result.stdout + result.stderr


def test_dg_list_defs_shows_the_code_location(listed: dict[str, list[dict[str, object]]]) -> None:
    assets = {item["asset_key"] for item in listed["assets"]}
    assert {
        "system_digest",
        "digest_prefill",
        "seed_prompts",
        "amplified_prompts",
        "distilled_responses",
    } <= assets
    assert {"batch_job", "ingest_job", "distillation_job"} <= {j["name"] for j in listed["jobs"]}
    assert "nightly_distillation_schedule" in {s["name"] for s in listed["schedules"]}
    assert "inbox_sensor" in {s["name"] for s in listed["sensors"]}
    checks = {item["key"] for item in listed["asset_checks"]}
    assert "distilled_responses:no_duplicate_request_ids" in checks
    assert {r["name"] for r in listed["resources"]} >= {"llama", "digest", "warehouse", "trino"}


def test_workspace_yaml_names_the_code_location_of_tool_dg() -> None:
    """One name: pyproject's [tool.dg.project]; workspace.yaml (dagster dev -w) agrees."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["dg"]["project"]
    workspace = yaml.safe_load((REPO_ROOT / "workspace.yaml").read_text())
    (location,) = workspace["load_from"]
    module = location["python_module"]
    assert module["location_name"] == project["code_location_name"]
    assert module["module_name"] == project["code_location_target_module"]
    assert "dagster" not in tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]


@pytest.mark.slow
def test_a_file_scaffolded_with_dg_loads(tmp_path: Path) -> None:
    name = f"scaffolded_{tmp_path.name[-8:].replace('-', '_')}"
    path = REPO_ROOT / "kimi_batch" / "defs" / f"{name}.py"
    try:
        scaffold = _dg(tmp_path, "scaffold", "defs", "dagster.asset", f"{name}.py")
        assert scaffold.returncode == 0, scaffold.stdout + scaffold.stderr
        assert path.is_file()
        listed = _dg(tmp_path, "list", "defs", "--json")
        checked = _dg(tmp_path, "check", "defs")
    finally:
        path.unlink(missing_ok=True)
    assert listed.returncode == 0, listed.stderr
    assert name in {item["asset_key"] for item in json.loads(listed.stdout)["assets"]}
    assert checked.returncode == 0, checked.stdout + checked.stderr
