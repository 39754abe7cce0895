"""Batch API batches on a real instance and a real server: each line that samples is its own
(batch id + custom_id), a greedy line is shared, and a rerun of a batch sends nothing."""

from __future__ import annotations

from typing import Any

import dagster as dg
import pytest

from kimi_batch.batch_api import ApiStore, BatchRecord, BatchStatus
from kimi_batch.engine import Ledger
from kimi_batch.settings import Settings
from kimi_batch_tests.support.batches import answered, jsonl, landed_batch
from kimi_batch_tests.support.llama_server import LlamaEnv

pytestmark = pytest.mark.slow  # every test answers batches on a real llama-server


def _landed(settings: Settings, temperature: float, n: int = 3) -> BatchRecord:
    """A landed batch of `n` identical lines (custom ids `line0..`)."""
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": "Write one word about the sea."}],
        "max_tokens": 6,
        "temperature": temperature,
    }
    lines = [
        {"custom_id": f"line{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}
        for i in range(n)
    ]
    return landed_batch(settings, jsonl(*lines), filename="same.jsonl")


def _answer(instance: dg.DagsterInstance, batch: BatchRecord) -> int:
    """Run the batch's partition; the requests it sent (the batch outcome's `generated`: the
    server's own count also holds the digest warm-up)."""
    settings = Settings.from_env()
    generated = answered(settings, instance, batch)["generated"]
    with ApiStore(settings.paths) as store:
        record = store.batch(batch.id)
    assert record is not None
    assert record.status == BatchStatus.COMPLETED
    assert isinstance(generated, int)
    return generated


def test_a_batch_samples_each_line_and_a_second_batch_samples_anew(llama_env: LlamaEnv) -> None:
    del llama_env  # the server and the state dir the resources find
    settings = Settings.from_env()
    with dg.instance_for_test() as instance, Ledger(settings.paths.ledger_path) as ledger:
        start = ledger.count()
        first = _landed(settings, temperature=1.0)
        sent_first = _answer(instance, first)
        after_first = ledger.count()
        sent_rerun = _answer(instance, first)  # a rerun of the same batch
        second = _landed(settings, temperature=1.0)
        sent_second = _answer(instance, second)
        after_second = ledger.count()
        greedy = _landed(settings, temperature=0.0)
        sent_greedy = _answer(instance, greedy)
        end = ledger.count()

    assert (sent_first, after_first - start) == (3, 3)  # three lines, three samples
    assert sent_rerun == 0  # the ledger has the batch's own answers
    assert (sent_second, after_second - after_first) == (3, 3)  # not the first batch's
    assert (sent_greedy, end - after_second) == (1, 1)  # determined: one answer, shared
