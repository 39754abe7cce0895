"""The ledger keeps every committed row across processes and never records one twice."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kimi_batch.engine.generation import GenerationResult
from kimi_batch.engine.ledger import LeaseHeldError, Ledger
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


def test_iter_results_streams_in_the_asked_order_in_chunks(tmp_path: Path) -> None:
    with Ledger(tmp_path / "ledger.sqlite3") as ledger:
        for i in range(7):
            ledger.put(_result(f"r{i}", f"text {i}"))
        asked = ["r6", "missing", "r0", "r3", "r0", "r5", "r1", "r2", "r4"]
        streamed = ledger.iter_results(asked, chunk_size=2)
        first = next(streamed)  # lazy: rows come as they are read, not all at once
        rest = list(streamed)
    assert [r.request_id for r in [first, *rest]] == [k for k in asked if k != "missing"]
    assert rest[0].text == "text 0"


def _hold_lease_then_die(path: Path, ttl_s: float) -> subprocess.CompletedProcess[bytes]:
    script = (
        "import os, sys, pathlib\n"
        "from kimi_batch.engine.ledger import Ledger\n"
        "ledger = Ledger(pathlib.Path(sys.argv[1]))\n"
        "with ledger.lease('2025-01-01|web', 'dead-run', ttl_s=float(sys.argv[2])):\n"
        "    os.kill(os.getpid(), 9)\n"
    )
    return subprocess.run([sys.executable, "-c", script, str(path), str(ttl_s)], check=False)


def test_a_second_holder_waits_then_gets_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    with Ledger(path) as first, Ledger(path) as second:
        with first.lease("2025-01-01|web", "run-a", ttl_s=0.6) as lease:
            # Held past several ttls: the heartbeat renews it, so it never expires while held.
            with (
                pytest.raises(LeaseHeldError, match="run-a"),
                second.lease("2025-01-01|web", "run-b", wait_s=1.5, poll_s=0.1),
            ):
                pass
            assert not lease.lost
        # Released on exit: the next run takes it at once.
        with second.lease("2025-01-01|web", "run-b") as taken:
            assert taken.owner == "run-b"


def test_a_waiting_holder_gets_the_lease_when_the_first_lets_go(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    order: list[str] = []

    def second_run() -> None:
        with Ledger(path) as ledger, ledger.lease("p", "run-b", wait_s=30, poll_s=0.05):
            order.append("b")

    with Ledger(path) as ledger:
        with ledger.lease("p", "run-a"):
            waiter = threading.Thread(target=second_run)
            waiter.start()
            time.sleep(0.3)
            order.append("a done")
        waiter.join(timeout=30)
    assert order == ["a done", "b"]


def test_other_partitions_are_not_blocked(tmp_path: Path) -> None:
    with (
        Ledger(tmp_path / "l.sqlite3") as ledger,
        ledger.lease("p1", "run-a"),
        ledger.lease("p2", "run-b") as other,
    ):
        assert other.partition_key == "p2"


def test_the_lease_of_a_killed_run_expires_and_is_taken_over(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    assert _hold_lease_then_die(path, ttl_s=1.0).returncode == -9
    with Ledger(path) as ledger, ledger.lease("2025-01-01|web", "run-b", wait_s=30, poll_s=0.1):
        pass  # taken over once the dead run's ttl passed


def test_count_by_tag_reads_without_creating_or_writing(tmp_path: Path) -> None:
    path = tmp_path / "ledger" / "ledger.sqlite3"
    assert Ledger.count_by_tag(path) == {}
    assert not path.parent.exists()
    with Ledger(path) as ledger:
        ledger.put(make_result("a", request_id="r1", input_id="s1", tag="paraphrase"))
        ledger.put(make_result("b", request_id="r2", input_id="s1", tag="paraphrase"))
        ledger.put(make_result("c", request_id="r3", input_id="s1", tag="seed"))
        # Beside a live writer: the reader sees what is committed.
        assert Ledger.count_by_tag(path) == {"paraphrase": 2, "seed": 1}
    before = path.stat().st_mtime_ns
    assert Ledger.count_by_tag(path) == {"paraphrase": 2, "seed": 1}
    assert path.stat().st_mtime_ns == before
