"""`kimi-batch status [--json]` and `kimi-batch digest lint`, run as the CLI against the real thing.

The state dir is the session's (`llama_env`): its real resident llama-server, a real ledger file
and a real Dagster instance under $KIMI_BATCH_HOME/dagster, where the real digest assets run and
stand-ins for `distilled_responses` (same key and partitions) and a stand-in nightly run (over two
partitions, one landed) leave one partition done, one failed, one stopped at the nightly window,
and an inbox file that never ran.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from kimi_batch.definitions import DIGEST_ASSETS, build_resources
from kimi_batch.defs.jobs import nightly_run_config
from kimi_batch.defs.partition_states import INPUT_SHA_METADATA, STOPPED_AT_WINDOW_TAG
from kimi_batch.defs.partitions import DATE_DIMENSION, SOURCE_DIMENSION, build_batch_partitions
from kimi_batch.defs.schedules import NIGHT_TAG, TRIGGER_TAG
from kimi_batch.engine.ledger import Ledger
from kimi_batch.engine.stats import ProgressEvent
from kimi_batch.inputs.landing import Landing
from kimi_batch.settings import Settings
from kimi_batch_tests.support.night_standin import failing_night_job
from kimi_batch_tests.support.ports import free_port
from kimi_batch_tests.support.repo import REPO_ROOT
from kimi_batch_tests.support.results import make_result

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:Non-compliant tag keys:DeprecationWarning"),
]

CLI = Path(sys.executable).parent / "kimi-batch"
# Recent, so inside the date partitions whatever their configured start.
DAY = (datetime.now(UTC).date() - timedelta(days=3)).isoformat()
PROGRESS = ProgressEvent(
    done=1, total=2, failed=0, completion_tokens_per_s=1.0, elapsed_s=1.0, eta_s=1.0
)


@pytest.fixture(autouse=True)
def _state_dirs_instance(monkeypatch: pytest.MonkeyPatch) -> None:
    """status reads DAGSTER_HOME's instance when it is set: these tests mean the state dir's."""
    monkeypatch.delenv("DAGSTER_HOME", raising=False)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CLI), *args], capture_output=True, text=True, timeout=300, check=False
    )


def _key(source: str) -> str:
    return str(dg.MultiPartitionKey({DATE_DIMENSION: DAY, SOURCE_DIMENSION: source}))


# Every partition's inbox file has these bytes.
INBOX_LINE = '{"prompt": "status?"}\n'
INBOX_SHA256 = hashlib.sha256(INBOX_LINE.encode()).hexdigest()


def _standin(*, fail: bool) -> dg.AssetsDefinition:
    @dg.asset(
        name="distilled_responses", partitions_def=build_batch_partitions(Settings.from_env())
    )
    def distilled_responses() -> dg.MaterializeResult:
        if fail:
            raise RuntimeError("stand-in failure")
        # The input version a real distillation records (else status counts it stale).
        return dg.MaterializeResult(metadata={INPUT_SHA_METADATA: INBOX_SHA256})

    return distilled_responses


@pytest.fixture(scope="module")
def state(llama_env: Any) -> Settings:
    """The session's state dir with a ledger, an inbox and an instance in known states."""
    settings = Settings.from_env()
    settings.paths.dagster_home.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO_ROOT / "dagster.yaml", settings.paths.dagster_home / "dagster.yaml")
    for source in ("st_done", "st_failed", "st_stopped", "st_never"):
        folder = settings.paths.inbox_dir / DAY
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{source}.jsonl").write_text(INBOX_LINE)
    # The partitions are fixed the first time anything sees the files (here: as the sensor would).
    with Landing(settings.paths) as landing:
        landing.assign_inbox(
            settings.paths.inbox_dir,
            arrived=settings.today(),
            start=settings.first_partition_date(),
        )
    with Ledger(settings.paths.ledger_path) as ledger:
        ledger.put(make_result(request_id="status-amp", tag="paraphrase"))
        ledger.put(make_result(request_id="status-seed", tag="seed"))
        ledger.put(make_result(request_id="status-var", tag="variant:harder"))

    instance = dg.DagsterInstance.from_config(str(settings.paths.dagster_home))
    try:
        instance.add_dynamic_partitions("source", ["st_done", "st_failed", "st_stopped"])
        # The real digest prefill, after the server started: the slots hold the digest.
        assert dg.materialize(
            DIGEST_ASSETS, resources=build_resources(Settings.from_env()), instance=instance
        ).success
        runs: list[tuple[str, bool, dict[str, str]]] = [
            ("st_done", False, {}),
            # A window-stopped run fails its step ("N of M rows done, resumes next night").
            ("st_stopped", True, {STOPPED_AT_WINDOW_TAG: "true"}),
        ]
        for source, fail, tags in runs:
            dg.materialize(
                [_standin(fail=fail)],
                partition_key=_key(source),
                instance=instance,
                tags=tags,
                raise_on_error=False,
            )
        # The night: one nightly_job run over two partitions, one landed and one lost.
        night = [_key("st_done"), _key("st_failed")]
        failing_night_job(
            night[:1], progress=PROGRESS, input_sha256=INBOX_SHA256
        ).execute_in_process(
            instance=instance,
            run_config=nightly_run_config(night),
            tags={TRIGGER_TAG: "nightly", NIGHT_TAG: DAY},
            raise_on_error=False,
        )
    finally:
        instance.dispose()
    return settings


def test_status_json_reports_every_section(state: Settings, llama_env: Any) -> None:
    result = _cli("status", "--json")
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert set(status) == {
        "server",
        "ledger",
        "partitions",
        "nightly",
        "inbox",
        "quality",
        "tables",
    }
    assert status["quality"]["dedup"] is True  # the default
    assert status["quality"]["error"] is None

    server = status["server"]
    assert server["running"]
    assert server["healthy"]
    assert server["pid"] == llama_env.server.status().pid
    assert server["base_url"] == llama_env.base_url
    assert server["slots"] == llama_env.slots
    assert server["slots_busy"] + server["slots_idle"] == llama_env.slots
    assert server["digest"]["restored"] is True, server["digest"]

    ledger = status["ledger"]
    assert ledger["rows"] == sum(ledger["by_table"].values()) >= 3
    assert ledger["by_table"]["amplified"] >= 1
    assert ledger["by_table"]["distilled"] >= 2

    partitions = status["partitions"]
    assert partitions["dagster_home"] == str(state.paths.dagster_home)
    keys = partitions["keys"]
    assert _key("st_failed") in keys["failed"]
    assert _key("st_stopped") in keys["stopped_at_window"]
    assert _key("st_never") in keys["pending"]
    assert _key("st_done") not in {k for listed in keys.values() for k in listed}
    assert partitions["done"] >= 1
    assert partitions["failed"] >= 1
    assert partitions["stopped_at_window"] >= 1

    nightly = status["nightly"]
    assert nightly["cron"] == "0 2 * * *"
    assert nightly["schedule"] == "stopped"
    assert nightly["next"] is None
    assert nightly["last"]["night"] == DAY
    assert nightly["last"]["runs"] == 1
    assert nightly["last"]["statuses"] == {"FAILURE": 1}
    assert nightly["last"]["partitions"] == 2
    assert nightly["last"]["partition_states"] == {"done": 1, "failed": 1}

    inbox = status["inbox"]
    waiting = {Path(name).name for name in inbox["waiting_files"]}
    assert {"st_failed.jsonl", "st_stopped.jsonl", "st_never.jsonl"} <= waiting
    assert "st_done.jsonl" not in waiting
    assert inbox["files"] >= 4


def test_status_text_is_one_screen(state: Settings) -> None:
    result = _cli("status")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) <= 24
    assert lines[0].startswith("server     healthy pid=")
    assert any(line.startswith("digest") and " restored " in line for line in lines)
    assert any("stopped at the nightly window" in line for line in lines)
    nightly = next(line for line in lines if line.startswith("nightly"))
    assert f"last night {DAY}: 2 partition(s) (1 done, 1 failed) in 1 run(s) (1 FAILURE)" in nightly


def test_status_without_an_instance_still_reports_the_rest(tmp_path: Path, llama_env: Any) -> None:
    env = {
        **os.environ,
        "KIMI_BATCH_HOME": str(tmp_path),
        "KIMI_BATCH_LLAMA_URL": llama_env.base_url,
    }
    result = subprocess.run(
        [str(CLI), "status", "--json"], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert status["partitions"]["dagster_home"] is None
    assert status["server"]["healthy"]
    assert status["server"]["digest"]["restored"] is None
    assert status["ledger"]["rows"] == 0


def test_status_right_after_server_start_on_a_fresh_state_dir(
    tmp_path: Path, llama_env: Any
) -> None:
    """A newcomer's first `status`: a server just started, an empty instance, nothing run."""
    home = tmp_path / "fresh"
    (home / "dagster").mkdir(parents=True)
    shutil.copy(REPO_ROOT / "dagster.yaml", home / "dagster" / "dagster.yaml")  # as `make dev`
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("KIMI_BATCH_LLAMA_")},
        "KIMI_BATCH_HOME": str(home),
        "KIMI_BATCH_LLAMA_SERVER": os.environ["KIMI_BATCH_LLAMA_SERVER"],
        "KIMI_BATCH_LLAMA_PORT": str(free_port()),
        "KIMI_BATCH_LLAMA_THREADS": "1",
        "KIMI_BATCH_LLAMA_CTX": "2048",
        "KIMI_BATCH_LLAMA_PARALLEL": "1",
        # The digest, a question and the answer budget must fit the one 2,048-token slot.
        "KIMI_BATCH_LLAMA_N_PREDICT": "256",
    }

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(CLI), *args], capture_output=True, text=True, env=env, timeout=300, check=False
        )

    assert cli("server", "start").returncode == 0
    try:
        text, as_json = cli("status"), cli("status", "--json")
    finally:
        cli("server", "stop")
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith("server     healthy pid=")
    assert as_json.returncode == 0, as_json.stderr
    status = json.loads(as_json.stdout)
    assert status["server"]["healthy"] is True
    assert status["partitions"]["dagster_home"] == str(home / "dagster")
    assert status["partitions"]["error"] is None
    assert status["ledger"]["rows"] == 0


@pytest.mark.no_llama_server  # no server started: runs beside the llama tier
def test_digest_lint_exits_1_with_one_line_per_finding(tmp_path: Path) -> None:
    digest = tmp_path / "digest.md"
    digest.write_text("You are a careful teacher.\nToday is {{today}}.\nRequest 2025-01-01.\n")
    result = _cli("digest", "lint", str(digest))
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        "line 2: placeholder '{{today}}'",
        "line 3: date '2025-01-01'",
    ]
    allowed = _cli("digest", "lint", str(digest), "--allow", "today", "--allow", r"\d{4}-")
    assert allowed.returncode == 0
    assert allowed.stdout == ""


@pytest.mark.no_llama_server  # no server started: runs beside the llama tier
def test_digest_lint_passes_the_shipped_digest() -> None:
    result = _cli("digest", "lint", str(REPO_ROOT / "kimi_batch" / "data" / "system_digest.md"))
    assert (result.returncode, result.stdout) == (0, "")


@pytest.mark.no_llama_server  # no server started: runs beside the llama tier
def test_digest_lint_of_a_missing_file_is_one_error_line(tmp_path: Path) -> None:
    result = _cli("digest", "lint", str(tmp_path / "nope.md"))
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert "nope.md" in result.stderr
    assert "Traceback" not in result.stderr
