"""Finish one Batch API batch (or parse its input) in a fresh process; print the peak RSS growth.

`python -m kimi_batch_tests.support.finish_memory_probe finish|parse ROWS TOKENS`, with
KIMI_BATCH_HOME a fresh state dir. Both land a batch of ROWS chat lines asking
`top_logprobs: 20`. `finish` also writes an answer of TOKENS tokens (20 alternatives each) per
line to the ledger, then writes the output and error files the way a batch whose run was killed
is finished (its lines read from the landed input); `parse` reads the landed input the way a run
does (`batch_lines`). The peak is the kernel's VmHWM, reset (`/proc/self/clear_refs`) after the
setup, so the growth is what the measured step costs.
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

from kimi_batch.batch_api import ApiStore, BatchRecord, BatchStatus, begin_batch, finish_batch
from kimi_batch.batch_api import lifecycle as api_batches
from kimi_batch.engine import Ledger
from kimi_batch.llama import TokenLogprob, TopLogprob
from kimi_batch.settings import Settings
from kimi_batch_tests.support.batches import chat_line, jsonl, landed_batch
from kimi_batch_tests.support.results import make_result

__all__ = ["main"]


def _kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _landed(settings: Settings, store: ApiStore, rows: int) -> BatchRecord:
    lines = (
        chat_line(f"c{i}", f"Question number {i}: say yes.", logprobs=True, top_logprobs=20)
        for i in range(rows)
    )
    data = jsonl(*lines)
    batch = landed_batch(settings, data, store=store)
    started = begin_batch(store, batch.id, run_id="probe", by_hand=False)
    assert started is not None
    return started


def _answer(settings: Settings, store: ApiStore, batch: BatchRecord, tokens: int) -> None:
    ids = [f"c{i}" for i in range(batch.request_total)]
    store.set_request_keys(batch.id, [(custom_id, f"key-{custom_id}") for custom_id in ids])
    top = [TopLogprob(token=f" tok{k}", logprob=-0.5 - k) for k in range(20)]
    logprobs = [TokenLogprob(token=f" tok{t}", logprob=-0.25, top=top) for t in range(tokens)]
    with Ledger(settings.paths.ledger_state) as ledger:
        for custom_id in ids:
            text = "".join(entry.token for entry in logprobs)
            ledger.put(
                make_result(
                    text,
                    request_id=f"key-{custom_id}",
                    input_id=custom_id,
                    completion_tokens=tokens,
                    logprobs=logprobs,
                )
            )


def _finish(settings: Settings, store: ApiStore, batch: BatchRecord) -> int:
    """The finish of a batch whose run was killed; the output file's size."""
    # The streamed read where there is one (a killed run's finish), else the whole read.
    read = getattr(api_batches, "iter_batch_lines", api_batches.batch_lines)
    with Ledger(settings.paths.ledger_state) as ledger:
        done = finish_batch(store, ledger, batch.id, read(settings, batch), BatchStatus.FAILED)
    assert done.output_file_id is not None
    output = store.file(done.output_file_id)
    assert output is not None
    return output.bytes


def main(argv: list[str]) -> None:
    mode, rows, tokens = argv[0], int(argv[1]), int(argv[2])
    settings = Settings.from_env()
    with ApiStore(settings.paths) as store:
        batch = _landed(settings, store, rows)
        if mode == "finish":
            _answer(settings, store, batch, tokens)
        gc.collect()
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
        before = _kib("VmHWM")
        if mode == "finish":
            size = _finish(settings, store, batch)
        else:
            size = len(api_batches.batch_lines(settings, batch))
        peak = _kib("VmHWM")
        record = store.batch(batch.id)
        assert record is not None
        upload = store.file(record.input_file_id)
        assert upload is not None
    report = {
        "mode": mode,
        "rows": rows,
        "input_bytes": upload.bytes,
        "output_bytes" if mode == "finish" else "lines": size,
        "growth_mb": (peak - before) / 1024,
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1:])
