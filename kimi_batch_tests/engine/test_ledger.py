"""The ledger keeps every committed row across processes and never records one twice."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kimi_batch.engine.ledger import Ledger
from kimi_batch.engine.requests import GenerationResult
from kimi_batch_tests.support.results import make_result


def _result(request_id: str, text: str = "answer") -> GenerationResult:
    return make_result(text, request_id=request_id, input_id="seed-1", tag="seed")


def test_put_is_first_writer_wins(tmp_path: Path) -> None:
    with Ledger(tmp_path / "ledger.sqlite3") as ledger:
        assert ledger.put(_result("a", "first")) is True
        assert ledger.put(_result("a", "second")) is False
        assert ledger.get_many(["a", "missing"])["a"].text == "first"
        assert ledger.count() == 1


@pytest.mark.slow
def test_rows_committed_by_a_killed_process_survive(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    script = (
        "import os, sys\n"
        "from kimi_batch.engine.ledger import Ledger\n"
        "from kimi_batch_tests.support.results import make_result\n"
        "ledger = Ledger(__import__('pathlib').Path(sys.argv[1]))\n"
        "for i in range(5):\n"
        "    ledger.put(make_result(request_id=f'r{i}', input_id='seed-1', tag='seed'))\n"
        "os.kill(os.getpid(), 9)\n"
    )
    killed = subprocess.run([sys.executable, "-c", script, str(path)], check=False)
    assert killed.returncode == -9
    with Ledger(path) as ledger:
        assert sorted(ledger.get_many(f"r{i}" for i in range(6))) == [f"r{i}" for i in range(5)]
