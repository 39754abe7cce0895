"""Two run workers, each a process with its own local folder, sharing only a real PostgreSQL and the
warehouse, on the same partitions of the real engine and server, and on the same Batch API batch:
every row once, every partition written by one worker, and a worker killed in the middle of a
partition or of the batch resumed by the other."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest

from kimi_batch.batch_api import ApiStore, BatchStatus
from kimi_batch.engine import Ledger
from kimi_batch.llama import ResidentServer
from kimi_batch.paths import StatePaths
from kimi_batch.settings import Settings
from kimi_batch.warehouse import CatalogSpec, Warehouse, open_warehouse
from kimi_batch_tests.support.batches import chat_line, jsonl, landed_batch
from kimi_batch_tests.support.engine import (
    digest_tokens,
    endpoint_of,
    fresh_digest,
    server_tasks,
)
from kimi_batch_tests.support.llama_server import LlamaEnv
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


def _kill_midway(
    first: subprocess.Popen[str],
    start_second: Callable[[], subprocess.Popen[str]],
    *,
    second_after: str,
) -> tuple[list[str], str]:
    """Start the second worker once the first said `second_after`, SIGKILL the first once it
    stalled; the first's lines since `second_after`, and the second's whole output (it must
    finish with 0)."""
    second: subprocess.Popen[str] | None = None
    try:
        _read_until(first, second_after)
        second = start_second()
        said_first = [] if second_after == "stalled" else _read_until(first, "stalled")
        os.kill(first.pid, signal.SIGKILL)
        assert first.wait(timeout=30) == -signal.SIGKILL
        out, _ = second.communicate(timeout=600)
    finally:
        for worker in (first, second):
            if worker is not None and worker.poll() is None:
                worker.kill()
    assert second is not None
    assert second.returncode == 0, out
    return said_first, out


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

    # The second goes the other way round: p2 at once, then waits on what the first holds; the
    # first is killed in the middle of p0.
    said_first, out = _kill_midway(
        _start(spec("worker-a", SOURCES, stall_after=STALL_AFTER)),
        lambda: _start(spec("worker-b", list(reversed(SOURCES)))),
        second_after="leased p0",
    )
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
    shared = StatePaths(
        home=tmp_path / "reader", warehouse_override=tmp_path / "warehouse", database_url=url
    )
    warehouse = Warehouse(CatalogSpec.from_paths(shared))  # its catalog in the shared PostgreSQL
    distilled = warehouse.read_table("distilled")
    assert distilled.height == len(SOURCES) * ROWS
    assert distilled["request_id"].n_unique() == distilled.height
    per_partition = distilled.group_by("source").agg(pl.len()).sort("source")
    assert per_partition["len"].to_list() == [ROWS] * len(SOURCES)
    assert warehouse.partitions("distilled") == [(DS, s) for s in SOURCES]


# ---- one Batch API batch, taken by the API on one host and answered by runs on two others -------

BATCH_LINES = 8


def test_two_run_workers_answer_one_api_batch_once_and_one_resumes_the_killed_one(
    llama_env: LlamaEnv,
    postgres_server: PostgresServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = postgres_server.new_database()
    warehouse = tmp_path / "warehouse"
    # The API's host: the upload, the validation and the landed input, in its own folder.
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path / "api-host"))
    monkeypatch.setenv("KIMI_BATCH_DATABASE_URL", url)
    monkeypatch.setenv("KIMI_BATCH_WAREHOUSE", str(warehouse))
    api = Settings.from_env()
    lines = [
        chat_line(f"q{i}", f"Name a fruit, number {i}.", max_tokens=6, temperature=0.0)
        for i in range(BATCH_LINES)
    ]
    batch = landed_batch(api, jsonl(*lines))
    assert batch.source is not None

    def worker(name: str, *stall_after: int) -> subprocess.Popen[str]:
        env = {
            **os.environ,
            "KIMI_BATCH_HOME": str(tmp_path / name),  # nothing of the API host's files
            "KIMI_BATCH_LLAMA_URL": llama_env.base_url,  # the model host's server
        }
        argv = ["-m", "kimi_batch_tests.support.api_batch_worker", batch.id]
        return subprocess.Popen(
            [sys.executable, *argv, *map(str, stall_after)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )

    before = server_tasks(llama_env.server)
    # The second waits on the partition the first holds; the first is killed in the middle.
    _, out = _kill_midway(
        worker("run-host-a", STALL_AFTER), lambda: worker("run-host-b"), second_after="stalled"
    )
    metadata = json.loads(out.strip().splitlines()[-1])
    # The second run found the killed one's answers in the shared ledger and sent only the rest.
    assert metadata["from_ledger"] == STALL_AFTER
    assert metadata["generated"] == BATCH_LINES - STALL_AFTER
    assert metadata["batch_status"] == "completed"
    assert server_tasks(llama_env.server) - before >= BATCH_LINES

    # The API's host serves the output file a run wrote on another host: each request once.
    with ApiStore(api.paths) as store:
        done = store.batch(batch.id)
        assert done is not None
        assert done.status == BatchStatus.COMPLETED
        assert done.output_file_id is not None
        output = store.file(done.output_file_id)
        assert output is not None
        answered = [json.loads(line) for line in store.blob_path(output).read_text().splitlines()]
    assert sorted(line["custom_id"] for line in answered) == [f"q{i}" for i in range(BATCH_LINES)]
    # One row per request in the shared warehouse, kept or set aside (a cut-off answer).
    rows = [
        open_warehouse(api).read_partition(table, done.ds or "", batch.source)
        for table in ("distilled", "quarantine")
    ]
    request_ids = [rid for frame in rows for rid in frame["request_id"].drop_nulls().to_list()]
    assert len(request_ids) == len(set(request_ids)) == BATCH_LINES
