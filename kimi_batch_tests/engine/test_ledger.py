"""The ledger keeps every committed row across processes and never records one twice."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from kimi_batch.engine.ledger import Ledger
from kimi_batch.engine.requests import GenerationResult


def _result(request_id: str, text: str = "answer") -> GenerationResult:
    return GenerationResult(
        request_id=request_id,
        input_id="seed-1",
        tag="seed",
        model="m",
        digest_sha256="0" * 64,
        text=text,
        finish_reason="stop",
        prompt_tokens=10,
        cached_tokens=8,
        completion_tokens=3,
        prompt_ms=1.0,
        predicted_ms=2.0,
        latency_ms=3.0,
        endpoint="http://127.0.0.1:1",
        slot_id=0,
        logprobs=None,
        created_at=datetime(2026, 11, 30, tzinfo=UTC),
    )


def test_put_is_first_writer_wins(tmp_path: Path) -> None:
    with Ledger(tmp_path / "ledger.sqlite3") as ledger:
        assert ledger.put(_result("a", "first")) is True
        assert ledger.put(_result("a", "second")) is False
        assert ledger.get_many(["a", "missing"])["a"].text == "first"
        assert ledger.count() == 1


def test_rows_committed_by_a_killed_process_survive(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    script = (
        "import os, sys\n"
        "from kimi_batch.engine.ledger import Ledger\n"
        "from kimi_batch_tests.engine.test_ledger import _result\n"
        "ledger = Ledger(__import__('pathlib').Path(sys.argv[1]))\n"
        "for i in range(5):\n"
        "    ledger.put(_result(f'r{i}'))\n"
        "os.kill(os.getpid(), 9)\n"
    )
    killed = subprocess.run([sys.executable, "-c", script, str(path)], check=False)
    assert killed.returncode == -9
    with Ledger(path) as ledger:
        assert sorted(ledger.get_many(f"r{i}" for i in range(6))) == [f"r{i}" for i in range(5)]
