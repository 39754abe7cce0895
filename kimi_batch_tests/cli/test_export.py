"""`kimi-batch export --format openai-batch`: a distilled partition as OpenAI Batch output lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kimi_batch.storage import Warehouse
from kimi_batch_tests.support.rows import amplified, distilled, quarantined

pytestmark = pytest.mark.slow  # every test runs the CLI in a child process


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


def test_export_of_a_missing_partition_is_a_clear_error(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kimi_batch.cli", "export", "--date", "2026-11-30", "--source", "nope"],
        env={**os.environ, "KIMI_BATCH_HOME": str(tmp_path)},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert "no distilled partition" in result.stderr
