"""How many of the project's modules one Batch API line's trip runs: upload, batch created and
validated, the run's asset answering it, its output line read back (issue 46: a feature is one
package, so a line crosses few of them). `engine/` and `llama/` are not counted."""

from __future__ import annotations

import io
import json

import dagster as dg
import openai
import pytest

from kimi_batch.batch_api import ApiStore, BatchRecord
from kimi_batch.definitions import build_resources
from kimi_batch.settings import Settings
from kimi_batch_tests.support.api_server import serving_api
from kimi_batch_tests.support.batches import answered, chat_line, jsonl, validated
from kimi_batch_tests.support.llama_server import LlamaEnv
from kimi_batch_tests.support.module_trace import traced

pytestmark = pytest.mark.slow  # the line is answered by a real llama-server

KEY = "sk-trace-key"
# Measured when the features got their packages (issue 46 item 1): 62 modules in 12 packages
# (a top-level module such as paths.py counts as one); 66 once defs/ handed its Dagster-free
# logic to pipeline/ and batch_api/ (landed, checks, server, interrupts, runs; defs keeps thin
# wrappers over them); 54 once batch_api/ was one module per concept (its 17 on the trip, 9 of
# the package and 8 of web/, became 5: lines, store, lifecycle, web/app, web/guard); 35 once
# defs/, pipeline/ and storage/ did the same; 31 in 10 once a stage the quality gate does not
# screen stopped opening it (quality/'s 2), the state database picked its own backend, and the
# resources were built ahead of the trip, as the code location builds them once; 25 once the
# modules that were one concept became one (defs/'s stage asset with its driver and landing, the
# pipeline's driver with its landing, the warehouse's catalog, overwrite and tables, the state
# database with its SQLite backend, an input's landing with its snapshot); 24 once the deployment's
# server as a run uses it moved to engine/; 23 once the Batch API's stage (`ApiBatchTask`) moved
# from pipeline/ into the batch's lifecycle; 22 once opening a file only if it is a regular one
# became one storage primitive (the inbox's and the readers' twins). A ratchet, so the trip only
# gets shorter from here; the goal is at most 12 modules in at most 3 packages.
MAX_MODULES = 22
MAX_PACKAGES = 10


def test_one_batch_api_line_runs_few_modules(
    llama_env: LlamaEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KIMI_BATCH_API_KEY", KEY)
    settings = Settings.from_env()
    # The resources are built ahead, as the code location builds them once: not the trip.
    resources = build_resources(settings)
    # The server starts inside the trace: a profile reaches only the threads started after it.
    with dg.instance_for_test() as instance, traced() as trace, serving_api(settings) as url:
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
        answered(settings, instance, record, resources)
        done = client.batches.retrieve(batch.id)
        assert done.output_file_id is not None
        (line,) = client.files.content(done.output_file_id).text.splitlines()
    assert json.loads(line)["custom_id"] == "one"

    print(trace.report())
    assert len(trace.modules) <= MAX_MODULES, trace.modules
    assert len(trace.packages) <= MAX_PACKAGES, trace.packages


def _record(settings: Settings, batch_id: str) -> BatchRecord:
    with ApiStore(settings.paths) as store:
        record = store.batch(batch_id)
    assert record is not None
    return record
