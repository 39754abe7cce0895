"""One Batch API batch from upload to finish through the real store, for the crash-point sweep.

    python -m kimi_batch_tests.support.crash_batch     (a worker: the batch once, in this process)

`run_batch(settings)` does, or resumes, what the API and the batch's run do: the input uploaded
and the batch created (`landed_batch`: a validating batch is validated again, as a restarted
API resumes it), taken up (`begin_batch`), its answers recorded in the ledger (made up: the
engine's stand-in), finished (`finish_batch`: output file, counts, final status; the sensor
retries a finish that did not end) and its input file deleted by the user. With
`run_ends=True` the run dies before its finish and the Batch API sensor's logic finishes the
batch (`finish_abandoned_batch`: the attempt counted, `failed` naming the run, the answered
requests in its output file). `check_batch` asserts what must hold after any crash and one rerun.
"""

from __future__ import annotations

import json

import dagster as dg

from kimi_batch.batch_api import ApiStore, BatchRecord, BatchStatus, begin_batch, finish_batch
from kimi_batch.batch_api.lifecycle import batch_lines, validate_batch
from kimi_batch.defs.api_sensor import finish_abandoned_batch
from kimi_batch.engine import Ledger
from kimi_batch.settings import Settings
from kimi_batch_tests.support.batches import chat_line, jsonl, landed_batch
from kimi_batch_tests.support.results import make_result

__all__ = ["CUSTOM_IDS", "check_batch", "run_batch"]

CUSTOM_IDS = ["a", "b", "c"]
# The batch's run, failed before it finished the batch (its process killed).
_DEAD_RUN = dg.DagsterRun(
    job_name="api_batch_job", run_id="run-1", status=dg.DagsterRunStatus.FAILURE
)


def _batch(settings: Settings, store: ApiStore) -> BatchRecord:
    """The batch: created now, or the one a crashed run left (validated again if it must be)."""
    found = store.batches()
    if not found:
        data = jsonl(*(chat_line(i, f"Say {i}.") for i in CUSTOM_IDS))
        return landed_batch(settings, data, store=store)
    return validate_batch(settings, store, found[0])


def run_batch(settings: Settings, *, run_ends: bool = False) -> None:
    """The batch's way from upload to finish (see the module's docstring); a rerun resumes."""
    with ApiStore(settings.paths) as store, Ledger(settings.paths.ledger_state) as ledger:
        batch = _batch(settings, store)
        assert batch.input_sha256 is not None, batch
        begin_batch(store, batch.id, run_id="run-1", by_hand=False)
        lines = batch_lines(settings, batch)
        store.set_request_keys(
            batch.id, [(line.custom_id, f"key-{line.custom_id}") for line in lines]
        )
        for line in lines:
            ledger.put(
                make_result(
                    f"Answer {line.custom_id}",
                    request_id=f"key-{line.custom_id}",
                    input_id=line.custom_id,
                )
            )
        if run_ends:
            finish_abandoned_batch(settings, store, store.batch(batch.id) or batch, _DEAD_RUN)
        else:
            finish_batch(store, ledger, batch.id, lines, BatchStatus.COMPLETED)
        store.delete_file(batch.input_file_id)


def check_batch(settings: Settings, *, run_ends: bool = False) -> None:
    """One batch, completed (failed once its run ended first, named once); its output file
    holds each request's answer once; every file record names bytes that are there; its input
    is deleted."""
    with ApiStore(settings.paths) as store:
        (batch,) = store.batches()
        status = BatchStatus.FAILED if run_ends else BatchStatus.COMPLETED
        assert batch.status == status, batch.status
        assert [e.code for e in batch.errors] == (["run_failed"] if run_ends else [])
        assert batch.error_file_id is None
        assert batch.output_file_id is not None
        output = store.file(batch.output_file_id)
        assert output is not None
        answers = [json.loads(line) for line in store.blob_path(output).read_text().splitlines()]
        assert sorted(a["custom_id"] for a in answers) == CUSTOM_IDS
        for file in store.files():
            assert store.blob_path(file).is_file(), file
        assert store.file(batch.input_file_id) is None


if __name__ == "__main__":
    run_batch(Settings.from_env())
