"""A Batch API line's `stop` reaches the real server: the answer ends before the stop string,
with `finish_reason: "stop"`, where the same line without it runs on (issue 27, item 5)."""

from __future__ import annotations

import json
from typing import Any

import dagster as dg
import pytest

from kimi_batch.settings import Settings
from kimi_batch.storage import ApiStore, BatchStatus
from kimi_batch_tests.support.batches import answered, landed_batch
from kimi_batch_tests.support.llama_server import LlamaEnv

pytestmark = pytest.mark.slow  # answers a batch on a real llama-server

_COUNT = "Count from 1 to 10, separated by commas. Reply with the numbers only."


def _line(custom_id: str, **body: Any) -> bytes:
    request = {
        "messages": [{"role": "user", "content": _COUNT}],
        "max_tokens": 40,
        "temperature": 0,
        **body,
    }
    line = {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions"}
    return json.dumps({**line, "body": request}).encode() + b"\n"


def _answered(settings: Settings, instance: dg.DagsterInstance, data: bytes) -> dict[str, Any]:
    """Land and run a batch of `data`; the first choice of each output line, by custom_id."""
    batch = landed_batch(settings, data, filename="stop.jsonl")
    assert batch.request_total == 1, batch.errors
    answered(settings, instance, batch)
    with ApiStore(settings.paths) as store:
        record = store.batch(batch.id)
        assert record is not None
        assert record.status == BatchStatus.COMPLETED
        assert record.output_file_id is not None
        output = store.file(record.output_file_id)
        assert output is not None
        lines = store.blob_path(output).read_text().splitlines()
    return {
        row["custom_id"]: row["response"]["body"]["choices"][0] for row in map(json.loads, lines)
    }


def test_a_lines_stop_string_ends_its_answer_on_the_server(llama_env: LlamaEnv) -> None:
    del llama_env  # the server and the state dir the resources find
    settings = Settings.from_env()
    with dg.instance_for_test() as instance:
        free = _answered(settings, instance, _line("free"))["free"]
        text = free["message"]["content"]
        # A stop string the greedy answer holds past its start: the stopped answer must end
        # before it (on the server: nothing here trims an answer).
        words = [w for w in text.split() if text.index(w) > 0]
        assert words, f"the answer is too short to stop inside: {text!r}"
        stop = words[len(words) // 2]
        stopped = _answered(settings, instance, _line("stopped", stop=[stop]))["stopped"]
    assert stopped["finish_reason"] == "stop"
    assert stop not in stopped["message"]["content"]
    assert text.startswith(stopped["message"]["content"].rstrip())
    assert len(stopped["message"]["content"]) < len(text)
