"""The Batch API without a model: files, validation, auth and limits, through the `openai` client."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from kimi_batch.batch_api import ApiStore
from kimi_batch.settings import Settings
from kimi_batch_tests.support.api_server import serving_api
from kimi_batch_tests.support.batches import MODEL, validated

KEY = "sk-test-key"


def line(custom_id: str, content: str = "Say hi.", **body: object) -> dict[str, object]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": MODEL, "messages": [{"role": "user", "content": content}], **body},
    }


def jsonl(*rows: object) -> bytes:
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KIMI_BATCH_API_KEY", KEY)
    monkeypatch.setenv("KIMI_BATCH_MAX_INPUT_MB", "1")
    return Settings.from_env()


@pytest.fixture
def base_url(settings: Settings) -> Iterator[str]:
    with serving_api(settings) as url:
        yield url


@pytest.fixture
def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key=KEY, max_retries=0)


def stored_files(settings: Settings) -> tuple[list[str], list[Path]]:
    with ApiStore(settings.paths) as store:
        ids = [record.id for record in store.files()]
    blobs = [p for p in settings.paths.api_files_dir.iterdir() if p.is_file()]
    return ids, blobs


def test_a_file_round_trips_and_is_kept_owner_only(
    client: openai.OpenAI, settings: Settings
) -> None:
    data = jsonl(line("a"), line("b"))
    created = client.files.create(file=("in.jsonl", data), purpose="batch")
    assert created.bytes == len(data)
    assert created.filename == "in.jsonl"
    assert client.files.retrieve(created.id).id == created.id
    assert [f.id for f in client.files.list()] == [created.id]
    assert client.files.content(created.id).read() == data
    ids, blobs = stored_files(settings)
    assert ids == [created.id]
    assert len(blobs) == 1
    assert blobs[0].stat().st_mode & 0o777 == 0o600
    # The same bytes again: a second id, one blob; deleting one id keeps the other's content.
    again = client.files.create(file=("copy.jsonl", data), purpose="batch")
    assert len(stored_files(settings)[1]) == 1
    assert client.files.delete(created.id).deleted
    assert client.files.content(again.id).read() == data
    client.files.delete(again.id)
    assert stored_files(settings) == ([], [])
    with pytest.raises(openai.NotFoundError) as missing:
        client.files.retrieve(created.id)
    assert missing.value.body["code"] == "not_found"  # type: ignore[index]


def test_a_file_whose_bytes_are_gone_is_not_found_never_a_server_error(
    client: openai.OpenAI, base_url: str, settings: Settings
) -> None:
    # Found by review: a delete killed between unlinking the bytes and its commit left the id
    # listed without them, and its content raised inside the response (500).
    data = jsonl(line("a"))
    kept = client.files.create(file=("kept.jsonl", data), purpose="batch")
    lost = client.files.create(file=("lost.jsonl", jsonl(line("b"))), purpose="batch")
    with ApiStore(settings.paths) as store:
        record = store.file(lost.id)
        assert record is not None
        (store.files_dir / record.sha256).unlink()
    with pytest.raises(openai.NotFoundError) as missing:
        client.files.content(lost.id)
    error = missing.value.body
    assert isinstance(error, dict)
    assert (error["code"], error["param"]) == ("not_found", "id")
    assert error["message"].startswith(f"No such File object: {lost.id}")
    auth = {"Authorization": f"Bearer {KEY}"}
    content = httpx.get(f"{base_url}/files/{kept.id}/content", headers=auth)
    assert (content.status_code, content.content) == (200, data)
    assert content.headers["content-length"] == str(len(data))


@pytest.mark.parametrize("key", [None, "sk-wrong"])
def test_a_wrong_or_missing_key_is_401_and_nothing_is_stored(
    base_url: str, settings: Settings, key: str | None
) -> None:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    response = httpx.post(
        f"{base_url}/files",
        headers=headers,
        files={"file": ("in.jsonl", jsonl(line("a")))},
        data={"purpose": "batch"},
    )
    assert response.status_code == 401
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "invalid_api_key"
    assert stored_files(settings) == ([], [])
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=base_url, api_key="sk-wrong", max_retries=0).batches.list()


def test_a_file_over_the_input_limit_is_413_before_it_is_stored(
    client: openai.OpenAI, base_url: str, settings: Settings
) -> None:
    big = b"x" * (settings.max_input_bytes + 1)
    with pytest.raises(openai.APIStatusError) as refused:
        client.files.create(file=("big.jsonl", big), purpose="batch")
    assert refused.value.status_code == 413
    assert stored_files(settings) == ([], [])

    # Without a Content-Length (a chunked upload) the store refuses it while counting.
    def chunks() -> Iterator[bytes]:
        boundary = b"--b0undary"
        yield boundary + b'\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        yield boundary + b'\r\nContent-Disposition: form-data; name="file"; filename="b.jsonl"'
        yield b"\r\nContent-Type: application/octet-stream\r\n\r\n"
        for _ in range(settings.max_input_bytes // (1 << 16) + 2):
            yield b"y" * (1 << 16)
        yield b"\r\n" + boundary + b"--\r\n"

    response = httpx.post(
        f"{base_url}/files",
        headers={
            "Authorization": f"Bearer {KEY}",
            "Content-Type": "multipart/form-data; boundary=b0undary",
        },
        content=chunks(),
    )
    assert response.status_code == 413
    assert stored_files(settings) == ([], [])


def test_a_duplicate_custom_id_fails_the_batch_naming_the_line(client: openai.OpenAI) -> None:
    data = jsonl(line("a"), line("b"), line("a", "Again."))
    upload = client.files.create(file=("dup.jsonl", data), purpose="batch")
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    batch = validated(client, batch)
    assert batch.status == "failed"
    assert batch.failed_at is not None
    assert batch.errors is not None
    assert batch.errors.data is not None
    [error] = batch.errors.data
    assert error.code == "duplicate_custom_id"
    assert error.line == 3
    assert "line 1" in (error.message or "")
    assert client.batches.retrieve(batch.id).status == "failed"


def test_a_wrong_url_and_a_bad_json_line_fail_the_batch(client: openai.OpenAI) -> None:
    wrong_url = {**line("b"), "url": "/v1/embeddings"}
    data = jsonl(line("a"), wrong_url) + b"{not json\n"
    upload = client.files.create(file=("bad.jsonl", data), purpose="batch")
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    batch = validated(client, batch)
    assert batch.status == "failed"
    assert batch.errors is not None
    assert batch.errors.data is not None
    assert [(e.code, e.line) for e in batch.errors.data] == [
        ("invalid_url", 2),
        ("invalid_json_line", 3),
    ]


def test_a_valid_batch_is_landed_and_waits_for_its_run(
    client: openai.OpenAI, settings: Settings
) -> None:
    upload = client.files.create(file=("ok.jsonl", jsonl(line("a"), line("b"))), purpose="batch")
    batch = client.batches.create(
        input_file_id=upload.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"team": "evals"},
    )
    assert batch.status == "validating"  # at once, as OpenAI's; validated in a worker
    batch = validated(client, batch)
    assert batch.status == "validating"  # landed, waiting for its run
    assert batch.metadata == {"team": "evals"}
    assert batch.expires_at == batch.created_at + 24 * 3600
    assert batch.request_counts is not None
    assert batch.request_counts.total == 2
    with ApiStore(settings.paths) as store:
        record = store.batch(batch.id)
    assert record is not None
    assert record.source == batch.id
    assert record.input_sha256
    assert (settings.paths.landed_dir / f"{record.input_sha256}.jsonl").is_file()
    assert [b.id for b in client.batches.list()] == [batch.id]
    cancelled = client.batches.cancel(batch.id)
    assert cancelled.status == "cancelling"
    assert cancelled.cancelling_at is not None


def test_a_bad_endpoint_or_window_is_a_400_in_openai_shape(client: openai.OpenAI) -> None:
    upload = client.files.create(file=("ok.jsonl", jsonl(line("a"))), purpose="batch")
    with pytest.raises(openai.BadRequestError) as bad:
        client.batches.create(
            input_file_id=upload.id,
            endpoint="/v1/embeddings",
            completion_window="24h",
        )
    assert bad.value.body["param"] == "endpoint"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError):
        client.batches.create(
            input_file_id=upload.id,
            endpoint="/v1/chat/completions",
            completion_window="1h",  # type: ignore[arg-type]
        )


def test_completions_and_responses_batches_validate_and_their_lines_must_match_them(
    client: openai.OpenAI,
) -> None:
    prompt = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 4}
    completion = {"custom_id": "p", "method": "POST", "url": "/v1/completions", "body": prompt}
    asked = {"model": MODEL, "instructions": "Be brief.", "input": "Hi.", "max_output_tokens": 4}
    response = {"custom_id": "r", "method": "POST", "url": "/v1/responses", "body": asked}
    for row in (completion, response):
        upload = client.files.create(file=("lines.jsonl", jsonl(row)), purpose="batch")
        batch = client.batches.create(
            input_file_id=upload.id,
            endpoint=row["url"],  # type: ignore[arg-type]
            completion_window="24h",
        )
        batch = validated(client, batch)
        assert batch.errors is None, row["url"]
        assert batch.request_counts is not None
        assert batch.request_counts.total == 1
    # A completions file named as a Responses batch: its line names another endpoint.
    upload = client.files.create(file=("p.jsonl", jsonl(completion)), purpose="batch")
    mismatched = validated(
        client,
        client.batches.create(
            input_file_id=upload.id, endpoint="/v1/responses", completion_window="24h"
        ),
    )
    assert mismatched.errors is not None
    assert [(e.code, e.line) for e in mismatched.errors.data or []] == [("invalid_url", 1)]


def test_an_ignored_field_or_an_unknown_model_fails_the_batch_naming_the_line(
    client: openai.OpenAI,
) -> None:
    unknown = line("b")
    unknown["body"] = {**unknown["body"], "model": "gpt-4o-mini"}  # type: ignore[dict-item]
    data = jsonl(line("a", stop=["\n"]), unknown, line("c", functions=[{"name": "f"}]))
    upload = client.files.create(file=("fields.jsonl", data), purpose="batch")
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    batch = validated(client, batch)
    assert batch.status == "failed"
    assert batch.errors is not None
    assert batch.errors.data is not None
    expected = [("model_not_found", 2, "body.model"), ("unsupported_field", 3, "body.functions")]
    if MODEL == "any":  # no model installed: no served name to compare with
        expected = expected[1:]
    assert [(e.code, e.line, e.param) for e in batch.errors.data] == expected
