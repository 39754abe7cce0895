"""`dg` (dagster-dg-cli) loads the project from pyproject's [tool.dg], as Dagster users expect.

Run from the repository root like a user would, without DAGSTER_HOME: dg then makes a temporary
instance from ./dagster.yaml, which must therefore not need DAGSTER_HOME either.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kimi_batch_tests.support.repo import REPO_ROOT

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
