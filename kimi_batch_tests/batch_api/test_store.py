"""The Batch API store: compare-and-set status changes (a cancel between any two run steps is
honoured), uploads racing deletes of the same bytes, and a killed writer's temp files.

Every test runs on both state backends (`state_backend`: SQLite files, a PostgreSQL database)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kimi_batch.batch_api import (
    ApiStore,
    BatchRecord,
    BatchStatus,
    FileContentMissingError,
    FileRecord,
    batch_lines,
    begin_batch,
    finish_batch,
    iter_batch_lines,
    lifecycle,
    process_running,
    process_token,
    validate_batch,
)
from kimi_batch.batch_api import lines as batch_input
from kimi_batch.batch_api.lines import BatchRequestLine, parse_batch_input
from kimi_batch.crash_points import CrashPointReached, armed
from kimi_batch.engine import Ledger
from kimi_batch.llama import process_stat
from kimi_batch.settings import Settings
from kimi_batch.storage import BlobStore
from kimi_batch_tests.support.batches import chat_line, jsonl, landed_batch
from kimi_batch_tests.support.postgres import StateBackend
from kimi_batch_tests.support.results import make_result

# Above the kernel's largest pid_max (2**22): never a live process.
DEAD_PID = (1 << 22) + 7


@pytest.fixture
def settings(state_backend: StateBackend, monkeypatch: pytest.MonkeyPatch) -> Settings:
    state_backend.apply(monkeypatch)
    return Settings.from_env()


@pytest.fixture
def store(settings: Settings) -> Iterator[ApiStore]:
    with ApiStore(settings.paths) as opened:
        yield opened


def _landed(settings: Settings, store: ApiStore, *ids: str) -> BatchRecord:
    landed = landed_batch(settings, jsonl(*(chat_line(i) for i in ids)), store=store)
    assert landed.input_sha256 is not None
    return landed


def _lines(*ids: str) -> list[BatchRequestLine]:
    data = jsonl(*(chat_line(i) for i in ids))
    return parse_batch_input(io.BytesIO(data), endpoint="/v1/chat/completions").lines


def _cancel(store: ApiStore, batch_id: str) -> None:
    """What the API's cancel does (`POST /v1/batches/{id}/cancel`)."""
    store.update_batch(batch_id, status=BatchStatus.CANCELLING)


def _answered(settings: Settings, store: ApiStore, batch_id: str) -> Ledger:
    store.set_request_keys(batch_id, [("a", "key-a"), ("b", "key-b")])
    ledger = Ledger(settings.paths.ledger_state)
    ledger.put(make_result("A", request_id="key-a", input_id="a"))
    ledger.put(make_result("B", request_id="key-b", input_id="b"))
    return ledger


def _output(store: ApiStore, record: BatchRecord) -> list[dict[str, Any]]:
    assert record.output_file_id is not None
    found = store.file(record.output_file_id)
    assert found is not None
    return [json.loads(line) for line in store.blob_path(found).read_text().splitlines()]


# ---- compare-and-set ------------------------------------------------------------------------


def test_a_cancel_between_reading_the_batch_and_starting_it_is_honoured(
    settings: Settings, store: ApiStore
) -> None:
    batch = _landed(settings, store, "a", "b")
    read = store.batch(batch.id)  # the run reads the batch: validated, not cancelled
    assert read is not None
    assert read.status == BatchStatus.VALIDATING
    _cancel(store, batch.id)  # the cancel lands in between
    # The old step (update_batch to in_progress) overwrote the cancel: it no longer can.
    store.update_batch(batch.id, status=BatchStatus.IN_PROGRESS, run_id="r1")
    assert store.batch(batch.id).status == BatchStatus.CANCELLING  # type: ignore[union-attr]
    assert begin_batch(store, batch.id, run_id="r1", by_hand=False) is None
    with Ledger(settings.paths.ledger_state) as ledger:
        done = finish_batch(store, ledger, batch.id, _lines("a", "b"), BatchStatus.CANCELLED)
    assert done.status == BatchStatus.CANCELLED


def test_a_cancel_after_the_last_request_before_finalizing_is_honoured(
    settings: Settings, store: ApiStore
) -> None:
    batch = _landed(settings, store, "a", "b")
    started = begin_batch(store, batch.id, run_id="r1", by_hand=False)
    assert started is not None
    assert started.status == BatchStatus.IN_PROGRESS
    with _answered(settings, store, batch.id) as ledger:
        _cancel(store, batch.id)  # every request answered, the cancel before the run's end
        done = finish_batch(store, ledger, batch.id, _lines("a", "b"), BatchStatus.COMPLETED)
    assert done.status == BatchStatus.CANCELLED
    assert [line["custom_id"] for line in _output(store, done)] == ["a", "b"]


@pytest.mark.parametrize("when", ["before the files", "after the files"])
def test_a_cancel_while_finalizing_is_honoured(
    settings: Settings, store: ApiStore, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    batch = _landed(settings, store, "a", "b")
    assert begin_batch(store, batch.id, run_id="r1", by_hand=False) is not None
    write = lifecycle.write_batch_files

    def cancelled_around(*args: Any, **kwargs: Any) -> BatchRecord:
        assert store.batch(batch.id).status == BatchStatus.FINALIZING  # type: ignore[union-attr]
        if when == "before the files":
            _cancel(store, batch.id)
        record = write(*args, **kwargs)
        if when == "after the files":
            _cancel(store, batch.id)
        return record

    monkeypatch.setattr(lifecycle, "write_batch_files", cancelled_around)
    with _answered(settings, store, batch.id) as ledger:
        done = finish_batch(store, ledger, batch.id, _lines("a", "b"), BatchStatus.COMPLETED)
    assert done.status == BatchStatus.CANCELLED
    assert done.cancelled_at is not None
    assert len(_output(store, done)) == 2  # the answers are all there


def test_a_finished_batch_is_never_cancelled_or_restarted(
    settings: Settings, store: ApiStore
) -> None:
    batch = _landed(settings, store, "a", "b")
    assert begin_batch(store, batch.id, run_id="r1", by_hand=False) is not None
    with _answered(settings, store, batch.id) as ledger:
        done = finish_batch(store, ledger, batch.id, _lines("a", "b"), BatchStatus.COMPLETED)
    assert done.status == BatchStatus.COMPLETED
    assert store.transition(batch.id, BatchStatus.CANCELLING) is None
    assert begin_batch(store, batch.id, run_id="r2", by_hand=False) is None
    rerun = begin_batch(store, batch.id, run_id="r3", by_hand=True)  # by hand: sends the rest
    assert rerun is not None
    assert (rerun.status, rerun.run_id) == (BatchStatus.COMPLETED, "r3")


def test_a_transition_moves_only_from_the_expected_statuses(
    settings: Settings, store: ApiStore
) -> None:
    batch = _landed(settings, store, "a")
    assert store.transition(batch.id, BatchStatus.COMPLETED) is None  # not from validating
    moved = store.transition(batch.id, BatchStatus.IN_PROGRESS, run_id="r1")
    assert moved is not None
    assert (moved.status, moved.run_id) == (BatchStatus.IN_PROGRESS, "r1")
    assert moved.in_progress_at is not None
    again = store.transition(batch.id, BatchStatus.IN_PROGRESS, expect=[BatchStatus.VALIDATING])
    assert again is None
    assert store.batch(batch.id) == moved  # nothing changed


def test_a_cancel_while_the_input_is_validated_ends_the_batch_cancelled(
    settings: Settings, store: ApiStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch = store.add_upload_batch(jsonl(chat_line("a")))
    scan = lifecycle.scan_batch_input

    def cancelled_midway(*args: Any, **kwargs: Any) -> Any:
        _cancel(store, batch.id)
        return scan(*args, **kwargs)

    monkeypatch.setattr(lifecycle, "scan_batch_input", cancelled_midway)
    done = validate_batch(settings, store, batch)
    assert done.status == BatchStatus.CANCELLED  # no run will ever come for it
    assert done.input_sha256 is None
    assert store.validation_claim(batch.id) is None


# ---- the request limit -----------------------------------------------------------------------


def test_a_batch_over_the_default_limit_runs_with_the_deployment_s_limit(
    settings: Settings, store: ApiStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by review: validation honoured KIMI_BATCH_API_MAX_BATCH_REQUESTS but the run read
    # the landed input with the default (OpenAI's 50,000), so every larger batch failed with no
    # output file. The default lowered to 3 stands for 50,000 here.
    for reader in (batch_input.parse_batch_input, batch_input.iter_batch_input):
        assert reader.__kwdefaults__ is not None
        monkeypatch.setitem(reader.__kwdefaults__, "max_requests", 3)
    raised = settings.model_copy(update={"api_max_batch_requests": 5})
    batch = _landed(raised, store, "a", "b", "c", "d")
    assert batch.request_total == 4
    assert [line.custom_id for line in batch_lines(raised, batch)] == ["a", "b", "c", "d"]
    assert [line.custom_id for line in iter_batch_lines(raised, batch)] == ["a", "b", "c", "d"]
    # A limit lowered after the batch was landed does not fail it either.
    lowered = settings.model_copy(update={"api_max_batch_requests": 2})
    assert len(batch_lines(lowered, batch)) == len(list(iter_batch_lines(lowered, batch))) == 4


# ---- blobs: an upload racing a delete of the same bytes -------------------------------------


def test_a_delete_racing_an_upload_of_the_same_bytes_keeps_the_new_upload_s_content(
    store: ApiStore,
) -> None:
    data = jsonl(chat_line("a"))
    first = store.add_file(io.BytesIO(data), filename="1.jsonl", purpose="batch", max_bytes=1 << 20)
    # The second upload of the same bytes is copied and hashed ...
    staged = store.stage_file(io.BytesIO(data), max_bytes=1 << 20)
    # ... the first id is deleted in between: no id names the blob, it goes ...
    assert store.delete_file(first.id)
    assert not (store.files_dir / first.sha256).exists()
    # ... and keeping the second puts the bytes back with its id.
    second = store.keep_file(staged, filename="2.jsonl", purpose="batch")
    assert store.blob_path(second).read_bytes() == data
    assert [f.id for f in store.files()] == [second.id]
    assert not staged.temp.exists()


def test_a_delete_after_an_upload_of_the_same_bytes_keeps_the_blob(store: ApiStore) -> None:
    data = jsonl(chat_line("a"))
    first = store.add_file(io.BytesIO(data), filename="1.jsonl", purpose="batch", max_bytes=1 << 20)
    staged = store.stage_file(io.BytesIO(data), max_bytes=1 << 20)
    second = store.keep_file(staged, filename="2.jsonl", purpose="batch")
    assert store.delete_file(first.id)
    assert store.blob_path(second).read_bytes() == data
    assert store.delete_file(second.id)
    assert not (store.files_dir / second.sha256).exists()
    assert not store.delete_file(second.id)


class _StoppedError(Exception):
    """Where a killed process would have stopped: the open transaction is rolled back."""


def _stop(*_: object) -> None:
    raise _StoppedError


def _upload(store: ApiStore, data: bytes) -> FileRecord:
    return store.add_file(io.BytesIO(data), filename="in.jsonl", purpose="batch", max_bytes=1 << 20)


def test_a_delete_stopped_before_its_commit_leaves_the_file_whole(
    store: ApiStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by review: the blob was unlinked before the commit, so a kill in between left the
    # id listed with its bytes gone, and its content answered 500.
    data = jsonl(chat_line("a"))
    record = _upload(store, data)
    with monkeypatch.context() as stopped:
        stopped.setattr(BlobStore, "forget", _stop)  # the last step inside the transaction
        with pytest.raises(_StoppedError):
            store.delete_file(record.id)
    assert [f.id for f in store.files()] == [record.id]
    assert store.blob_path(record).read_bytes() == data


def test_a_delete_stopped_after_its_commit_leaves_bytes_no_id_names_the_next_start_removes(
    store: ApiStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    gone, kept = _upload(store, b"gone\n"), _upload(store, b"kept\n")
    twice = _upload(store, b"twice\n")
    again = _upload(store, b"twice\n")  # the same bytes under a second id
    with monkeypatch.context() as stopped:
        stopped.setattr(ApiStore, "_remove_if_unnamed", _stop)
        with pytest.raises(_StoppedError):
            store.delete_file(gone.id)
    assert store.file(gone.id) is None  # the id went first: nothing names missing bytes
    assert (store.files_dir / gone.sha256).is_file()  # left behind, harmless
    assert store.delete_file(twice.id)  # a delete removes only bytes no id names any more
    assert store.blob_path(again).read_bytes() == b"twice\n"
    other = _upload(store, b"other\n")
    assert store.delete_file(other.id)
    assert not (store.files_dir / other.sha256).exists()
    assert store.remove_unnamed_blobs() == 1  # the API's start (`BatchValidator.resume`)
    blobs = sorted(p.name for p in store.files_dir.iterdir() if not p.name.startswith("."))
    assert blobs == sorted([kept.sha256, again.sha256])
    assert store.blob_path(kept).read_bytes() == b"kept\n"


def test_a_finish_stopped_while_replacing_its_output_file_keeps_the_record_readable(
    store: ApiStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A retried finish keeps its output under the same id: the record it replaces must keep its
    # bytes until the new record is committed.
    def keep(text: str) -> FileRecord:
        staged = store.stage_file(io.BytesIO(text.encode()), max_bytes=1 << 20)
        return store.keep_file(staged, filename="out.jsonl", purpose="batch_output", file_id="f-1")

    first = keep("first\n")
    with monkeypatch.context() as stopped:
        stopped.setattr(BlobStore, "forget", _stop)
        with pytest.raises(_StoppedError):
            keep("second\n")
    found = store.file("f-1")
    assert found is not None
    assert found == first
    assert store.blob_path(found).read_text() == "first\n"
    second = keep("second\n")
    assert store.blob_path(second).read_text() == "second\n"
    blobs = sorted(p.name for p in store.files_dir.iterdir() if not p.name.startswith("."))
    assert blobs == [second.sha256]


def test_a_file_whose_bytes_are_gone_says_so_instead_of_naming_a_missing_path(
    store: ApiStore,
) -> None:
    record = _upload(store, b"x\n")
    (store.files_dir / record.sha256).unlink()  # what a delete killed before the fix left
    # ... and, in PostgreSQL, no shared copy either
    store._blobs.forget(record.sha256)  # pyright: ignore[reportPrivateUsage]
    with pytest.raises(FileContentMissingError, match=record.id):
        store.blob_path(record)


# ---- temp files of a killed write -----------------------------------------------------------


def _stale(folder: Path, name: str, suffix: str = ".tmp") -> Path:
    stale = folder / f".{name}.{DEAD_PID}-{'0' * 32}{suffix}"
    stale.write_bytes(b"half a write")
    return stale


def test_the_next_upload_removes_a_killed_upload_s_temp_file(store: ApiStore) -> None:
    stale = _stale(store.files_dir, "upload")
    live = store.files_dir / f".upload.{os.getpid()}-{'1' * 32}.tmp"  # a writer still running
    live.write_bytes(b"being written")
    record = store.add_file(io.BytesIO(b"x\n"), filename="x", purpose="batch", max_bytes=10)
    assert not stale.exists()
    assert live.exists()
    hidden = sorted(p.name for p in store.files_dir.iterdir() if p.name.startswith("."))
    assert hidden == [live.name]
    assert store.blob_path(record).stat().st_mode & 0o777 == 0o600
    assert store.files_dir.stat().st_mode & 0o777 == 0o700


def test_owner_only_folders_and_files_for_what_a_cancel_leaves(
    settings: Settings, store: ApiStore
) -> None:
    batch = _landed(settings, store, "a", "b")
    _cancel(store, batch.id)
    with _answered(settings, store, batch.id) as ledger:
        done = finish_batch(store, ledger, batch.id, _lines("a", "b"), BatchStatus.CANCELLED)
    assert done.output_file_id is not None
    output = store.file(done.output_file_id)
    assert output is not None
    assert _mode(store.blob_path(output)) == 0o600
    assert _mode(settings.paths.api_dir) == _mode(settings.paths.api_files_dir) == 0o700


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


# ---- a finish stopped and retried -----------------------------------------------------------


@pytest.mark.parametrize("kept", [1, 2], ids=["output kept", "error kept"])
def test_a_finish_stopped_after_keeping_a_file_leaves_one_output_and_one_error_file(
    settings: Settings, store: ApiStore, kept: int
) -> None:
    # Found by the crash-point sweep: the retried finish kept a second output (or error) file
    # beside the one the stopped finish had kept but not yet named in the batch.
    batch = _landed(settings, store, "a", "b", "c")
    assert begin_batch(store, batch.id, run_id="r1", by_hand=False) is not None
    with _answered(settings, store, batch.id) as ledger:  # "c" is never answered
        with armed("api.file_kept", arrival=kept), pytest.raises(CrashPointReached):
            finish_batch(store, ledger, batch.id, _lines("a", "b", "c"), BatchStatus.EXPIRED)
        done = finish_batch(store, ledger, batch.id, _lines("a", "b", "c"), BatchStatus.EXPIRED)
    assert done.status == BatchStatus.EXPIRED
    made = store.files(purpose="batch_output")
    named = [done.output_file_id, done.error_file_id]
    assert sorted(f.id for f in made) == sorted(i for i in named if i is not None)
    assert None not in named
    assert [line["custom_id"] for line in _output(store, done)] == ["a", "b"]
    assert all(store.blob_path(f).is_file() for f in store.files())


def test_a_process_is_read_past_a_command_name_that_looks_like_stat_fields() -> None:
    """/proc/PID/stat puts the command name in parentheses, and a process may name itself
    anything: the fields are counted after the last ')'. A zombie has exited; a reaped one is
    gone; a token names one process, not its pid's later owner."""
    renamed = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import pathlib, sys, time; pathlib.Path('/proc/self/comm').write_text('a) Z 1 (b');"
            " print('ready', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert renamed.stdout is not None
        assert renamed.stdout.readline() == "ready\n"
        assert "a) Z 1 (b" in Path(f"/proc/{renamed.pid}/stat").read_text()
        stat = process_stat(renamed.pid)
        assert stat is not None
        assert not stat.exited, stat
        token = process_token(renamed.pid)
        assert token == f"{renamed.pid}.{stat.start_ticks}"
        assert process_running(token)
        assert not process_running(f"{renamed.pid}.{stat.start_ticks + 1}")  # a later process
        renamed.kill()
        deadline = time.monotonic() + 10
        while (zombie := process_stat(renamed.pid)) is not None and not zombie.exited:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert zombie is not None
        assert zombie.state == "Z"
        assert not process_running(token)
    finally:
        renamed.kill()
        renamed.wait()
    assert process_stat(renamed.pid) is None
    assert not process_running(token)
