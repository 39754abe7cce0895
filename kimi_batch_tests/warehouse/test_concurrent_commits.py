"""Several processes commit to one table at once on PostgreSQL; a killed commit changes nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kimi_batch.paths import StatePaths
from kimi_batch.warehouse import CatalogSpec, Warehouse
from kimi_batch_tests.support.postgres import PostgresServer
from kimi_batch_tests.support.rows import quarantined

# Its slow tests start no llama-server: they run beside the ones that do (support/slow_split.py).
pytestmark = pytest.mark.no_llama_server

DS = "2026-12-01"
WORKERS = 8

# One writer: waits for the go file, then overwrites its own partition (source w<N>) with
# 10 + N rows. With KILL_IN_COMMIT set it kills itself inside the catalog commit, after the
# metadata swap was sent and before the transaction commits.
_WRITER = """
import os, signal, sys, time
from pathlib import Path
from sqlalchemy import event
from sqlalchemy.orm import Session
from kimi_batch.paths import StatePaths
from kimi_batch.warehouse import CatalogSpec, Warehouse
from kimi_batch_tests.support.rows import quarantined
paths, index, go = StatePaths.model_validate_json(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
if os.environ.get("KILL_IN_COMMIT"):
    event.listen(Session, "before_commit", lambda session: os.kill(os.getpid(), signal.SIGKILL))
warehouse = Warehouse(CatalogSpec.from_paths(paths))
print("ready", flush=True)
while not go.exists():
    time.sleep(0.01)
rows = [row.model_copy(update={"reason": f"w{index}"}) for row in quarantined(10 + index)]
print(warehouse.write_partition("quarantine", sys.argv[4], f"w{index}", rows).snapshot_id)
"""


def _writer(paths: StatePaths, index: int, go: Path, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _WRITER, paths.model_dump_json(), str(index), str(go), DS],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )


@pytest.mark.slow
def test_eight_processes_commit_different_partitions_of_one_table(
    tmp_path: Path, postgres_server: PostgresServer
) -> None:
    paths = StatePaths(home=tmp_path / "state", database_url=postgres_server.new_database())
    warehouse = Warehouse(CatalogSpec.from_paths(paths))
    warehouse.write_partition("quarantine", DS, "w0", quarantined(1))  # the table exists
    go = tmp_path / "go"
    writers = [_writer(paths, index, go) for index in range(WORKERS)]
    for writer in writers:
        assert writer.stdout is not None
        assert writer.stdout.readline().strip() == "ready"
    go.touch()  # all at once: their metadata swaps race
    snapshots = []
    for writer in writers:
        out, _ = writer.communicate(timeout=300)
        assert writer.returncode == 0
        snapshots.append(int(out.split()[-1]))

    assert len(set(snapshots)) == WORKERS  # every commit landed, each its own snapshot
    counts = warehouse.read_table("quarantine").group_by("source").len().sort("source").rows()
    assert counts == [(f"w{index}", 10 + index) for index in range(WORKERS)]
    assert warehouse.count("quarantine") == sum(10 + index for index in range(WORKERS))


@pytest.mark.slow
def test_a_writer_killed_inside_its_commit_leaves_the_previous_snapshot(
    tmp_path: Path, postgres_server: PostgresServer
) -> None:
    paths = StatePaths(home=tmp_path / "state", database_url=postgres_server.new_database())
    warehouse = Warehouse(CatalogSpec.from_paths(paths))
    warehouse.write_partition("quarantine", DS, "w3", quarantined(2))
    before = warehouse.snapshot_id("quarantine")
    go = tmp_path / "go"
    go.touch()
    killed = _writer(paths, 3, go, KILL_IN_COMMIT="1")
    killed.communicate(timeout=120)
    assert killed.returncode == -signal.SIGKILL

    time.sleep(0.5)  # the server notices the dropped connection and rolls its transaction back
    after = Warehouse(CatalogSpec.from_paths(paths))
    assert after.snapshot_id("quarantine") == before
    assert after.read_partition("quarantine", DS, "w3").height == 2
    # The next writer commits over it as if nothing happened.
    assert after.write_partition("quarantine", DS, "w3", quarantined(5)).rows == 5
    assert after.read_partition("quarantine", DS, "w3").height == 5
