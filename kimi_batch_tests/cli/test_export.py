"""`kimi-batch export --format openai-batch`: a distilled partition as OpenAI Batch output lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import date
from pathlib import Path

import pytest

from kimi_batch.batch_api import API_STAGE
from kimi_batch.cli.commands import main
from kimi_batch.cli.export import ExportRequest, export_partition, run_export
from kimi_batch.exports import ExportQuery
from kimi_batch.settings import Settings
from kimi_batch.warehouse import Warehouse
from kimi_batch_tests.support.exports import DAYS, QUARANTINE_REASONS, SOURCES, build_warehouse
from kimi_batch_tests.support.rows import amplified, distilled, quarantined

# Its slow tests start no llama-server: they run beside the ones that do (support/slow_split.py).
pytestmark = pytest.mark.no_llama_server


@pytest.mark.slow  # runs the CLI in a child process
def test_export_writes_one_line_per_answer_and_per_failed_request(tmp_path: Path) -> None:
    warehouse = Warehouse(tmp_path / "home" / "warehouse")
    variants = amplified(2)
    answers = distilled(variants)
    failed = [
        row.model_copy(update={"stage": "distill", "input_id": "seed-9", "reason": "too long"})
        for row in quarantined(1)
    ]
    warehouse.write_partition("distilled", "2026-11-30", "batch", answers)
    warehouse.write_partition("quarantine", "2026-11-30", "batch", [*failed, *quarantined(2)])
    out = tmp_path / "out.jsonl"
    result = subprocess.run(
        [sys.executable, "-m", "kimi_batch.cli", "export", "--format", "openai-batch",
         "--date", "2026-11-30", "--source", "batch", "--out", str(out)],
        env={**os.environ, "KIMI_BATCH_HOME": str(tmp_path / "home")},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == len(answers) + 1  # input-stage quarantine rows are not batch results
    ok = lines[: len(answers)]
    assert [line["response"]["body"]["choices"][0]["message"]["content"] for line in ok] == [
        row.response for row in answers
    ]
    assert ok[0]["custom_id"] == f"seed-0:paraphrase:{variants[0].request_id}"
    usage = ok[0]["response"]["body"]["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == answers[0].cached_tokens
    assert lines[-1]["response"] is None
    assert lines[-1]["error"] == {"code": "quarantined", "message": "too long"}
    assert lines[-1]["custom_id"] == "seed-9"


@pytest.mark.slow  # runs the CLI in a child process
def test_export_of_a_missing_partition_is_a_clear_error(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kimi_batch.cli", "export", "--date", "2026-11-30", "--source", "nope"],
        env={**os.environ, "KIMI_BATCH_HOME": str(tmp_path)},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert "no distilled partition" in result.stderr


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


@pytest.fixture
def shared_umask() -> Iterator[None]:
    """What a shared box's users have: files 0644, folders 0755."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _exportable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path / "home"))
    settings = Settings.from_env()
    Warehouse(settings.paths.warehouse_dir).write_partition(
        "distilled", "2026-11-30", "batch", distilled(amplified(1))
    )
    return settings


@pytest.mark.usefixtures("shared_umask")
def test_the_default_export_is_owner_only_and_clears_a_killed_export_s_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = _exportable(tmp_path, monkeypatch)
    exports = settings.home / "exports"
    exports.mkdir(parents=True)  # 0755, as an older version left it
    name = "distilled-2026-11-30-batch.jsonl"
    stale = exports / f".{name}.{(1 << 22) + 7}-{'0' * 32}.tmp"  # a killed export's temp
    stale.write_text("half an export")
    path = export_partition(settings, ds="2026-11-30", source="batch", fmt="openai-batch", out=None)
    assert path == exports / name
    assert (_mode(path), _mode(exports)) == (0o600, 0o700)
    assert [p.name for p in exports.iterdir()] == [name]  # the stale temp is gone


@pytest.mark.usefixtures("shared_umask")
def test_an_export_elsewhere_creates_owner_only_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = _exportable(tmp_path, monkeypatch)
    out = tmp_path / "new" / "deeper" / "answers.jsonl"
    path = export_partition(
        settings, ds="2026-11-30", source="batch", fmt="openai-batch", out=str(out)
    )
    assert path == out
    assert _mode(out) == 0o600
    assert _mode(out.parent) == _mode(tmp_path / "new") == 0o700
    before = _mode(tmp_path)
    export_partition(settings, ds="2026-11-30", source="batch", fmt="openai-batch", out=str(out))
    assert _mode(tmp_path) == before  # a folder it did not create keeps its mode


def test_an_export_of_several_partitions_has_unique_custom_ids(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path / "home"))
    settings = Settings.from_env()
    build_warehouse(settings)  # seed-0, seed-1, ... in every partition
    path = run_export(settings, ExportRequest(fmt="openai-batch"))
    ids = [json.loads(line)["custom_id"] for line in path.read_text().splitlines()]
    partitions = [(ds, source) for ds in DAYS for source in SOURCES]
    assert len(ids) == len(set(ids))
    assert len(ids) == len(partitions) * (3 + len(QUARANTINE_REASONS)) + 2  # + the batch's two
    assert f"{DAYS[0]}/{SOURCES[0]}/seed-0" in ids
    one = run_export(
        settings,
        ExportRequest(
            fmt="openai-batch",
            query=ExportQuery(
                source=SOURCES[0],
                since=date.fromisoformat(DAYS[0]),
                until=date.fromisoformat(DAYS[0]),
            ),
        ),
    )
    single = [json.loads(line)["custom_id"] for line in one.read_text().splitlines()]
    assert single[0] == "seed-0"  # one partition keeps the ids a client joins on


def test_an_openai_batch_export_has_an_error_line_for_each_failed_request_of_a_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Batch API batch's answers are `distilled` rows of the `api` stage, and so are its
    set-aside and failed requests' quarantine rows: each gets its error line, as distill's do."""
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path / "home"))
    settings = Settings.from_env()
    warehouse = Warehouse(settings.paths.warehouse_dir)
    batch = "batch_" + "a" * 24
    answer = distilled(amplified(1))[0].model_copy(
        update={"input_id": "req-1", "seed_id": "req-1", "origin": "seed", "strategy": None}
    )
    failed = quarantined(1)[0].model_copy(
        update={"stage": API_STAGE, "input_id": "req-2", "request_id": "r-2", "reason": "cut off"}
    )
    warehouse.write_partition("distilled", "2026-11-30", batch, [answer])
    warehouse.write_partition("quarantine", "2026-11-30", batch, [failed, *quarantined(1)])
    path = run_export(settings, ExportRequest(fmt="openai-batch"))  # batches without --source
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["custom_id"] for line in lines] == ["req-1", "req-2"]
    assert lines[1]["response"] is None
    assert lines[1]["error"] == {"code": "quarantined", "message": "cut off"}


@pytest.mark.parametrize("fmt", ["openai-batch", "chat", "hf"])
def test_an_out_that_cannot_be_written_is_one_line_and_exit_2(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    fmt: str,
) -> None:
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path / "home"))
    build_warehouse(Settings.from_env())
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    for out in (blocker / "export.jsonl", tmp_path):  # under a file; a folder for a file
        if fmt == "hf" and out == tmp_path:
            continue  # hf writes a folder
        assert main(["export", "--format", fmt, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1
        assert f"cannot write the export to {out}" in err
        assert "Traceback" not in err
