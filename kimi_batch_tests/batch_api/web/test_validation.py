"""Batch validation through the `openai` client: off the request, every bad line a line error,
and nothing left `validating` or `cancelling` by a killed API process.

The server-free tests run on both state backends (`state_backend`: SQLite, PostgreSQL)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import openai
import pytest

from kimi_batch.batch_api import ApiStore, BatchStatus, process_token, validate_batch
from kimi_batch.settings import Settings
from kimi_batch_tests.support.api_server import serving_api
from kimi_batch_tests.support.batches import chat_line, jsonl, validated
from kimi_batch_tests.support.postgres import StateBackend
from kimi_batch_tests.support.validation_probe import measure_validation

# Its slow tests start no llama-server: they run beside the ones that do (support/slow_split.py).
pytestmark = pytest.mark.no_llama_server

KEY = "sk-test-key"
# Above the kernel's largest pid_max (2**22): never a live process.
DEAD_OWNER = f"{socket.gethostname()}:{(1 << 22) + 7}"


@pytest.fixture
def settings(state_backend: StateBackend, monkeypatch: pytest.MonkeyPatch) -> Settings:
    state_backend.apply(monkeypatch)
    monkeypatch.setenv("KIMI_BATCH_API_KEY", KEY)
    return Settings.from_env()


@pytest.fixture
def sqlite_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("KIMI_BATCH_DATABASE_URL", raising=False)
    monkeypatch.setenv("KIMI_BATCH_API_KEY", KEY)
    return Settings.from_env()


@pytest.fixture
def client(settings: Settings) -> Iterator[openai.OpenAI]:
    with serving_api(settings) as url:
        yield openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)


def test_nested_and_huge_integer_lines_fail_their_batch_naming_the_lines(
    client: openai.OpenAI,
) -> None:
    deep = b'{"custom_id": "deep", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n"
    huge = b'{"custom_id": "huge", "n": ' + b"9" * 5000 + b"}\n"
    data = jsonl(chat_line("a")) + deep + huge + jsonl(chat_line("d"))
    upload = client.files.create(file=("bad.jsonl", data), purpose="batch")
    created = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert created.status == "validating"
    batch = validated(client, created)
    assert batch.status == "failed"
    assert batch.errors is not None
    assert batch.errors.data is not None
    assert [(e.code, e.line) for e in batch.errors.data] == [
        ("invalid_json_line", 2),
        ("invalid_json_line", 3),
    ]
    assert all(e.message and e.message.startswith(f"line {e.line}") for e in batch.errors.data)
    # A retrieve and a list answer normally (no 500), and a cancel of a failed batch is a 409.
    assert [b.id for b in client.batches.list()] == [batch.id]
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(batch.id)


def test_a_batch_lands_on_the_day_it_was_created_whenever_it_is_validated(
    settings: Settings,
) -> None:
    """Validated a day late (resumed after midnight by a later start), a batch's partition is
    still dated the day it was created."""
    created = time.time() - 86_400
    with ApiStore(settings.paths) as store:
        batch = store.add_upload_batch(jsonl(chat_line("a")))
        batch = store.update_batch(batch.id, created_at=int(created))
        landed = validate_batch(settings, store, batch)
    assert landed.ds == settings.today(datetime.fromtimestamp(created, UTC)).isoformat()
    assert landed.ds != settings.today().isoformat()


def _reused_pid_owner() -> str:
    """A claim's owner with this process's pid and another start: an API killed, and this one
    started later under its pid (as pid 1 of a container is)."""
    pid, _, start = process_token().partition(".")
    return f"{socket.gethostname()}:{pid}.{int(start) - 1}"


def _left_by_a_killed_api(
    settings: Settings, *, cancelled: bool = False, owner: str = DEAD_OWNER
) -> str:
    """A batch recorded (and maybe cancelled) by an API process killed before validating it."""
    with ApiStore(settings.paths) as store:
        batch = store.add_upload_batch(jsonl(chat_line("a"), chat_line("b")), owner=owner)
        if cancelled:
            store.update_batch(batch.id, status=BatchStatus.CANCELLING)
    return batch.id


@pytest.mark.parametrize("reused_pid", [False, True], ids=["dead-pid", "reused-pid"])
def test_the_api_start_validates_what_a_killed_api_left_validating(
    settings: Settings, reused_pid: bool
) -> None:
    owner = _reused_pid_owner() if reused_pid else DEAD_OWNER
    left = _left_by_a_killed_api(settings, owner=owner)
    cancelled = _left_by_a_killed_api(settings, cancelled=True, owner=owner)
    with ApiStore(settings.paths) as store:  # bytes a delete killed after its commit left
        unnamed = store.files_dir / ("0" * 64)
        unnamed.write_bytes(b"no id names these\n")
    with serving_api(settings) as url:
        client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)
        batch = validated(client, client.batches.retrieve(left))
        assert batch.status == "validating"  # landed, waiting for its run
        assert batch.request_counts is not None
        assert batch.request_counts.total == 2
        gone = validated(client, client.batches.retrieve(cancelled))
        assert gone.status == "cancelled"
        assert gone.cancelled_at is not None
    with ApiStore(settings.paths) as store:
        record = store.batch(left)
        assert record is not None
        assert record.input_sha256 is not None
        assert store.validation_claim(left) is None  # the step is over
    assert not unnamed.exists()


@pytest.mark.slow  # a 200 MB file; the RSS of this process is the API's
def test_a_200_mb_file_validates_in_bounded_memory_while_requests_are_answered(
    sqlite_settings: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = measure_validation(sqlite_settings, tmp_path / "big.jsonl", KEY, size_mb=200)
    with capsys.disabled():
        print(f"\nvalidation of a 200 MB batch input: {json.dumps(report)}")
    assert report["status"] == "validating"  # landed: valid, waiting for its run
    assert report["request_total"] == 50_000
    assert report["rss_growth_mb"] < 300
    # Other requests were answered while the batch was still being validated.
    assert report["answered_while_validating"] > 0
