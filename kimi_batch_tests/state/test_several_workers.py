"""Two run workers, each a process with its own local folder, sharing only a real PostgreSQL and the
warehouse, on the same partitions of the real engine and server: every row once, every partition
written by one worker, and a worker killed in the middle of a partition resumed by the other."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from kimi_batch.engine import Ledger
from kimi_batch.llama import ResidentServer
from kimi_batch.paths import StatePaths
from kimi_batch.storage import Warehouse
from kimi_batch_tests.support.engine import digest_tokens, endpoint_of, fresh_digest
from kimi_batch_tests.support.postgres import PostgresServer
from kimi_batch_tests.support.state_worker import DS, WorkerSpec

pytestmark = pytest.mark.slow  # the real llama-server

SOURCES = ["p0", "p1", "p2"]
ROWS = 8
STALL_AFTER = 3
TTL_S = 2.0


def _start(spec: WorkerSpec) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "kimi_batch_tests.support.state_worker", spec.model_dump_json()],
        stdout=subprocess.PIPE,
        text=True,
    )


def _read_until(worker: subprocess.Popen[str], wanted: str) -> list[str]:
    assert worker.stdout is not None
    lines: list[str] = []
    for line in worker.stdout:
        lines.append(line.strip())
        if line.startswith(wanted):
            return lines
    raise AssertionError(f"the worker ended without saying {wanted!r}: {lines}")


async def test_two_workers_write_every_row_once_and_one_resumes_the_killed_one(
    shared_server: ResidentServer, postgres_server: PostgresServer, tmp_path: Path
) -> None:
    url = postgres_server.new_database()
    digest = fresh_digest("workers")
    tokens = await digest_tokens(shared_server, digest)

    def spec(name: str, sources: list[str], stall_after: int | None = None) -> WorkerSpec:
        local = StatePaths(home=tmp_path / name, database_url=url)  # its own folder
        return WorkerSpec(
            name=name,
            ledger=local.ledger_state,
            warehouse=tmp_path / "warehouse",  # the one shared warehouse
            endpoint=endpoint_of(shared_server),
            digest=digest.text,
            digest_tokens=tokens,
            sources=sources,
            rows=ROWS,
            ttl_s=TTL_S,
            stall_after=stall_after,
        )

    first = _start(spec("worker-a", SOURCES, stall_after=STALL_AFTER))
    second: subprocess.Popen[str] | None = None
    try:
        _read_until(first, "leased p0")
        # The second goes the other way round: p2 at once, then waits on what the first holds.
        second = _start(spec("worker-b", list(reversed(SOURCES))))
        said_first = _read_until(first, "stalled")
        os.kill(first.pid, signal.SIGKILL)  # killed in the middle of p0
        assert first.wait(timeout=30) == -signal.SIGKILL
        out, _ = second.communicate(timeout=600)
    finally:
        for worker in (first, second):
            if worker is not None and worker.poll() is None:
                worker.kill()
    assert second is not None
    assert second.returncode == 0, out
    said_second = out.split("\n")

    # Every partition written by exactly one worker; the other skipped it or never got to it.
    wrote = [line.split()[1] for line in said_first + said_second if line.startswith("wrote")]
    assert sorted(wrote) == SOURCES
    assert "wrote p0" not in " ".join(said_first)
    # The second took p0 over once the killed worker's lease ran out, and sent only the rest.
    (resumed,) = [line for line in said_second if line.startswith("wrote p0")]
    assert f"from_ledger={STALL_AFTER}" in resumed
    generated = sum(
        int(line.split("generated=")[1].split()[0])
        for line in said_first + said_second
        if line.startswith("wrote")
    )
    assert generated + STALL_AFTER == len(SOURCES) * ROWS  # each row generated once
    _every_row_once(url, tmp_path)


def _every_row_once(url: str, tmp_path: Path) -> None:
    """Each request once in the shared ledger, each row once in the shared warehouse."""
    with Ledger(StatePaths(home=tmp_path / "reader", database_url=url).ledger_state) as ledger:
        assert ledger.count() == len(SOURCES) * ROWS
    warehouse = Warehouse(tmp_path / "warehouse")
    distilled = warehouse.read_table("distilled")
    assert distilled.height == len(SOURCES) * ROWS
    assert distilled["request_id"].n_unique() == distilled.height
    per_partition = distilled.group_by("source").agg(pl.len()).sort("source")
    assert per_partition["len"].to_list() == [ROWS] * len(SOURCES)
    assert warehouse.partitions("distilled") == [(DS, s) for s in SOURCES]
