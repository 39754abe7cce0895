"""Finishing a Batch API batch: its output file is streamed, never held whole in memory; a
batch that ended without its files gets them from a rerun by hand, one with files keeps them.

Each measurement runs in its own process (`finish_memory_probe`); the peak RSS growth is the
kernel's VmHWM, a memory bound (never a time one). Measured here, 100 lines asking
`top_logprobs: 20` with 300-token answers (45 MiB of output): 468 MB of growth before the
files were streamed, 20 MB after.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kimi_batch.batch_api import (
    MAX_FINISH_ATTEMPTS,
    ApiStore,
    BatchRecord,
    BatchRunState,
    BatchStatus,
    batch_lines,
    begin_batch,
    finish_abandoned_batch,
    finish_batch,
    request_counts,
)
from kimi_batch.engine import Ledger
from kimi_batch.settings import Settings
from kimi_batch_tests.support.batches import chat_line, jsonl, landed_batch
from kimi_batch_tests.support.results import make_result

MIB = 1 << 20


def _probe(home: Path, mode: str, rows: int, tokens: int) -> dict[str, float]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "kimi_batch_tests.support.finish_memory_probe",
            mode,
            str(rows),
            str(tokens),
        ],
        env={**os.environ, "KIMI_BATCH_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    print(report)
    return report


def test_finishing_a_batch_with_logprobs_takes_less_memory_than_its_output(
    tmp_path: Path,
) -> None:
    report = _probe(tmp_path, "finish", 100, 300)
    output_mb = report["output_bytes"] / MIB
    assert output_mb > 40  # the story's scale: logprobs make the output file large
    # The whole output held once is already `output_mb`; before it was held ~10 times.
    assert report["growth_mb"] < output_mb / 2


# ---- a rerun by hand of a finished batch ------------------------------------------------------


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("KIMI_BATCH_DATABASE_URL", raising=False)
    return Settings.from_env()


def _lines_of(store: ApiStore, file_id: str | None) -> list[dict[str, Any]]:
    found = store.file(file_id) if file_id is not None else None
    assert found is not None
    return [json.loads(line) for line in store.blob_path(found).read_text().splitlines()]


def _taken_up(settings: Settings, store: ApiStore, ledger: Ledger, *ids: str) -> BatchRecord:
    """A landed batch of `ids` taken up by its run, its first request answered."""
    batch = landed_batch(settings, jsonl(*(chat_line(i) for i in ids)), store=store)
    assert begin_batch(store, batch.id, run_id="r1", by_hand=False) is not None
    store.set_request_keys(batch.id, [(i, f"key-{i}") for i in ids])
    ledger.put(make_result("A", request_id=f"key-{ids[0]}", input_id=ids[0]))
    return batch


def test_a_rerun_by_hand_writes_the_files_a_batch_ended_without(settings: Settings) -> None:
    # Found by review: a finish killed MAX_FINISH_ATTEMPTS times ends the batch `failed`
    # without files, its error promising "a rerun of the batch writes them"; the rerun's
    # finish returned at once on the final batch, so no output file ever came.
    with ApiStore(settings.paths) as store, Ledger(settings.paths.ledger_state) as ledger:
        batch = _taken_up(settings, store, ledger, "a", "b", "c")
        for _ in range(MAX_FINISH_ATTEMPTS):
            store.count_finish_attempt(batch.id)  # each start killed writing the files
        dead = BatchRunState(run_id="r1", status="FAILURE", ended=True)
        ended = finish_abandoned_batch(settings, store, batch, dead)
        assert (ended.status, ended.output_file_id, ended.error_file_id) == (
            BatchStatus.FAILED,
            None,
            None,
        )
        assert [error.code for error in ended.errors] == ["run_failed", "finish_failed"]

        assert begin_batch(store, batch.id, run_id="r2", by_hand=True) is not None
        ledger.put(make_result("B", request_id="key-b", input_id="b"))  # the rerun answers b
        lines = batch_lines(settings, batch)
        done = finish_batch(store, ledger, batch.id, lines, BatchStatus.COMPLETED)
        assert done.status == BatchStatus.FAILED  # a final status stays
        assert [line["custom_id"] for line in _lines_of(store, done.output_file_id)] == ["a", "b"]
        [unanswered] = _lines_of(store, done.error_file_id)
        assert (unanswered["custom_id"], unanswered["error"]["code"]) == ("c", "batch_failed")
        assert request_counts(store, ledger, done).model_dump() == {
            "total": 3,
            "completed": 2,
            "failed": 1,
        }

        # Written once: a later rerun's answer leaves the files as the client got them.
        ledger.put(make_result("C", request_id="key-c", input_id="c"))
        again = finish_batch(store, ledger, batch.id, lines, BatchStatus.COMPLETED)
        assert again == done
        assert len(_lines_of(store, again.output_file_id)) == 2


def test_a_rerun_by_hand_leaves_a_cancelled_batch_s_files_as_they_are(
    settings: Settings,
) -> None:
    with ApiStore(settings.paths) as store, Ledger(settings.paths.ledger_state) as ledger:
        batch = _taken_up(settings, store, ledger, "a", "b")
        store.update_batch(batch.id, status=BatchStatus.CANCELLING)  # the user's cancel
        lines = batch_lines(settings, batch)
        cancelled = finish_batch(store, ledger, batch.id, lines, BatchStatus.CANCELLED)
        assert cancelled.status == BatchStatus.CANCELLED
        output = _lines_of(store, cancelled.output_file_id)

        assert begin_batch(store, batch.id, run_id="r2", by_hand=True) is not None
        ledger.put(make_result("B", request_id="key-b", input_id="b"))
        done = finish_batch(store, ledger, batch.id, lines, BatchStatus.COMPLETED)
        assert (done.status, done.output_file_id, done.error_file_id) == (
            BatchStatus.CANCELLED,
            cancelled.output_file_id,
            cancelled.error_file_id,
        )
        assert _lines_of(store, done.output_file_id) == output  # the bytes a client may hold
        assert request_counts(store, ledger, done).completed == 2  # counted live
