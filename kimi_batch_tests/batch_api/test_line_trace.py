"""How many of the project's modules one Batch API line's trip runs: upload, batch created and
validated, the run's asset answering it, its output line read back (issue 46: a feature is one
package, so a line crosses few of them). `engine/` and `llama/` are not counted."""

from __future__ import annotations

import io
import json
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import dagster as dg
import openai
import pytest

import kimi_batch
import kimi_batch.definitions  # imported ahead: module code is not the line's trip
from kimi_batch.batch_api import ApiStore, BatchRecord
from kimi_batch.settings import Settings
from kimi_batch_tests.support.api_server import serving_api
from kimi_batch_tests.support.batches import answered, chat_line, jsonl, validated
from kimi_batch_tests.support.llama_server import LlamaEnv

pytestmark = pytest.mark.slow  # the line is answered by a real llama-server

PACKAGE = Path(kimi_batch.__file__).resolve().parent
NOT_COUNTED = ("engine", "llama")
KEY = "sk-trace-key"
# Measured when the features got their packages (issue 46 item 1): 62 modules in 12 packages
# (a top-level module such as paths.py counts as one); 66 once defs/ handed its Dagster-free
# logic to pipeline/ and batch_api/ (landed, checks, server, interrupts, runs; defs keeps thin
# wrappers over them). A ratchet, so the trip only gets shorter from here; the goal is
# at most 12 modules in at most 3 packages.
MAX_MODULES = 66
MAX_PACKAGES = 12


@contextmanager
def _traced() -> Iterator[set[str]]:
    """The project modules (paths under kimi_batch/) whose functions are called in the block,
    in this thread and in the threads it starts (the server's, the validation worker's)."""
    seen: set[str] = set()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            seen.add(frame.f_code.co_filename)

    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        yield seen
    finally:
        sys.setprofile(None)
        threading.setprofile(None)


def _counted(files: set[str]) -> list[str]:
    modules = set()
    for name in files:
        path = Path(name).resolve()
        if path.is_relative_to(PACKAGE):
            module = path.relative_to(PACKAGE).as_posix()
            if module.split("/")[0] not in NOT_COUNTED:
                modules.add(module)
    return sorted(modules)


def test_one_batch_api_line_runs_few_modules(
    llama_env: LlamaEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KIMI_BATCH_API_KEY", KEY)
    settings = Settings.from_env()
    # The server starts inside the trace: a profile reaches only the threads started after it.
    with dg.instance_for_test() as instance, _traced() as files, serving_api(settings) as url:
        client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)
        upload = client.files.create(
            file=("in.jsonl", io.BytesIO(jsonl(chat_line("one", max_tokens=4)))),
            purpose="batch",
        )
        batch = client.batches.create(
            input_file_id=upload.id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
        )
        validated(client, batch)
        record = _record(settings, batch.id)
        answered(settings, instance, record)
        done = client.batches.retrieve(batch.id)
        assert done.output_file_id is not None
        (line,) = client.files.content(done.output_file_id).text.splitlines()
    assert json.loads(line)["custom_id"] == "one"

    modules = _counted(files)
    packages = sorted({module.split("/")[0] for module in modules})
    print(f"{len(modules)} modules in {len(packages)} packages: {packages}\n" + "\n".join(modules))
    assert len(modules) <= MAX_MODULES, modules
    assert len(packages) <= MAX_PACKAGES, packages


def _record(settings: Settings, batch_id: str) -> BatchRecord:
    with ApiStore(settings.paths) as store:
        record = store.batch(batch_id)
    assert record is not None
    return record
