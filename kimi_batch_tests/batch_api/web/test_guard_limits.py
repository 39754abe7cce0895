"""Every size bounded while it is read: uploads (chunked too), JSON bodies, metadata, batch files."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from kimi_batch.batch_api import ApiStore
from kimi_batch.settings import Settings
from kimi_batch_tests.support.api_server import serving_api
from kimi_batch_tests.support.batches import MODEL

KEY = "sk-limits-test"
AUTH = {"Authorization": f"Bearer {KEY}"}
MIB = 1 << 20
BOUNDARY = "b0undary"


@pytest.fixture
def spool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The process's temp folder, watched too: a form parser spooling the upload lands there."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KIMI_BATCH_API_KEY", KEY)
    monkeypatch.setenv("KIMI_BATCH_API_MAX_BATCH_MB", "1")
    return Settings.from_env()


@pytest.fixture
def base_url(settings: Settings) -> Iterator[str]:
    with serving_api(settings) as url:
        yield url


@pytest.fixture
def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key=KEY, max_retries=0)


def bytes_on_disk(*roots: Path) -> int:
    """Bytes of the files under `roots`, plus this process's deleted-but-open files (a spooled
    upload: `tempfile.TemporaryFile` has no name on disk)."""
    total = 0
    for root in roots:
        for path in root.rglob("*"):
            with contextlib.suppress(FileNotFoundError):  # removed while we walked
                total += path.stat().st_size if path.is_file() else 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            info = os.stat(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if stat.S_ISREG(info.st_mode) and info.st_nlink == 0:
            total += info.st_size
    return total


def form_head(filename: str = "in.jsonl") -> bytes:
    return (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; '
        f'filename="{filename}"\r\nContent-Type: application/octet-stream\r\n\r\n'
    ).encode()


def form_tail() -> bytes:
    return f"\r\n--{BOUNDARY}--\r\n".encode()


def chunked_upload(base_url: str, chunks: Iterator[bytes]) -> httpx.Response:
    """A multipart upload without Content-Length (httpx sends a generator body chunked)."""
    headers = {**AUTH, "Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}
    return httpx.post(f"{base_url}/files", headers=headers, content=chunks, timeout=120)


def stored(settings: Settings) -> tuple[list[str], list[str]]:
    with ApiStore(settings.paths) as store:
        ids = [record.id for record in store.files()]
    return ids, sorted(p.name for p in settings.paths.api_files_dir.iterdir())


def test_a_chunked_40_mib_upload_is_cut_at_the_limit_with_under_2_mib_on_disk(
    base_url: str, settings: Settings, spool: Path
) -> None:
    baseline = bytes_on_disk(settings.home, spool)
    peak = 0

    def body() -> Iterator[bytes]:
        nonlocal peak
        yield form_head()
        for _ in range(40 * 16):
            peak = max(peak, bytes_on_disk(settings.home, spool) - baseline)
            yield b"y" * (64 * 1024)
        yield form_tail()

    response = chunked_upload(base_url, body())
    assert response.status_code == 413, response.text
    assert response.json()["error"]["code"] == "file_too_large"
    print(f"peak bytes on disk during a 40 MiB chunked upload against 1 MiB: {peak}")
    assert peak < 2 * MIB
    assert stored(settings) == ([], [])  # no id, no blob, no partial temp file


def test_a_chunked_upload_under_the_limit_is_kept_whole(
    client: openai.OpenAI, base_url: str, settings: Settings
) -> None:
    data = b"".join(
        json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions"}).encode()
        + b"\n"
        for i in range(2000)
    )
    whole = form_head("chunked.jsonl") + data + form_tail()

    def body() -> Iterator[bytes]:  # odd sizes: the parser sees boundaries split across chunks
        for start in range(0, len(whole), 4093):
            yield whole[start : start + 4093]

    response = chunked_upload(base_url, body())
    assert response.status_code == 200, response.text
    record = response.json()
    assert record["bytes"] == len(data)
    assert record["filename"] == "chunked.jsonl"
    assert client.files.content(record["id"]).read() == data
    assert len(stored(settings)[1]) == 1  # the blob only: no temp file left


def test_a_declared_upload_over_the_batch_file_limit_is_413_unread(
    client: openai.OpenAI, settings: Settings
) -> None:
    assert settings.api_max_upload_bytes == MIB  # KIMI_BATCH_API_MAX_BATCH_MB=1
    with pytest.raises(openai.APIStatusError) as refused:
        client.files.create(file=("big.jsonl", b"x" * (4 * MIB)), purpose="batch")
    assert refused.value.status_code == 413
    assert stored(settings) == ([], [])
    exact = client.files.create(file=("max.jsonl", b"x" * MIB), purpose="batch")
    assert exact.bytes == MIB


def test_a_malformed_or_fieldless_form_is_400_and_leaves_nothing(
    base_url: str, settings: Settings
) -> None:
    headers = {**AUTH, "Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}
    no_file = (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        f"--{BOUNDARY}--\r\n"
    ).encode()
    cases = [no_file, b"garbage" * 100, form_head() + b"x" * 100]  # the last: no closing boundary
    for content in cases:
        response = httpx.post(f"{base_url}/files", headers=headers, content=content)
        assert response.status_code == 400, response.text
    wrong_purpose = form_head().replace(b"\r\nbatch\r\n", b"\r\nfine-tune\r\n") + b"x" + form_tail()
    response = httpx.post(f"{base_url}/files", headers=headers, content=wrong_purpose)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "purpose"
    not_a_form = {**AUTH, "Content-Type": "application/octet-stream"}
    assert httpx.post(f"{base_url}/files", headers=not_a_form, content=b"x").status_code == 415
    assert stored(settings) == ([], [])


def _create(base_url: str, body: object) -> httpx.Response:
    headers = {**AUTH, "Content-Type": "application/json"}
    return httpx.post(f"{base_url}/batches", headers=headers, content=json.dumps(body), timeout=60)


def _upload(client: openai.OpenAI) -> str:
    line = {
        "custom_id": "a",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": MODEL, "messages": [{"role": "user", "content": "Hi."}]},
    }
    return client.files.create(file=("in.jsonl", json.dumps(line).encode()), purpose="batch").id


def test_metadata_over_openais_limits_is_400_and_no_batch_is_made(
    client: openai.OpenAI, base_url: str
) -> None:
    file_id = _upload(client)
    batch = {"input_file_id": file_id, "endpoint": "/v1/chat/completions"}
    batch["completion_window"] = "24h"
    too_many = {f"k{i}": "v" for i in range(5000)}
    cases = {
        "5,000 keys": too_many,
        "17 pairs": {f"k{i}": "v" for i in range(17)},
        "a 65-character key": {"k" * 65: "v"},
        "a 513-character value": {"k": "v" * 513},
    }
    for case, metadata in cases.items():
        response = _create(base_url, {**batch, "metadata": metadata})
        assert response.status_code == 400, (case, response.text)
        assert response.json()["error"]["param"] == "metadata"
    # 5,000 keys of 1 KB (the 5 MB): over the JSON body limit before it is parsed.
    huge = {f"k{i}": "v" * 1000 for i in range(5000)}
    assert _create(base_url, {**batch, "metadata": huge}).status_code == 413
    assert list(client.batches.list()) == []
    at_limit = {f"{i:064d}": "v" * 512 for i in range(16)}
    made = client.batches.create(
        input_file_id=file_id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata=at_limit,
    )
    assert made.metadata == at_limit


def test_a_json_body_over_1_mib_is_413_chunked_or_declared(base_url: str) -> None:
    body = json.dumps({"input_file_id": "x" * (MIB + 10)}).encode()
    headers = {**AUTH, "Content-Type": "application/json"}
    declared = httpx.post(f"{base_url}/batches", headers=headers, content=body)
    assert declared.status_code == 413

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(body), 64 * 1024):
            yield body[start : start + 64 * 1024]

    chunked = httpx.post(f"{base_url}/batches", headers=headers, content=chunks())
    assert chunked.status_code == 413
    cancel = httpx.post(f"{base_url}/batches/batch_x/cancel", headers=headers, content=chunks())
    assert cancel.status_code == 413


def test_the_batch_file_limits_default_to_openais_and_are_configurable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path))
    for name in (
        "KIMI_BATCH_API_MAX_BATCH_REQUESTS",
        "KIMI_BATCH_API_MAX_BATCH_MB",
        "KIMI_BATCH_MAX_INPUT_MB",
    ):
        monkeypatch.delenv(name, raising=False)
    defaults = Settings.from_env()
    assert defaults.api_max_batch_requests == 50_000
    assert defaults.api_max_batch_mb == 200
    assert defaults.api_max_upload_bytes == 200 * MIB
    monkeypatch.setenv("KIMI_BATCH_API_MAX_BATCH_REQUESTS", "10")
    monkeypatch.setenv("KIMI_BATCH_MAX_INPUT_MB", "5")  # a batch file is landed as an input
    configured = Settings.from_env()
    assert configured.api_max_batch_requests == 10
    assert configured.api_max_upload_bytes == 5 * MIB
