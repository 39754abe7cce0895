"""Credentials in a server URL reach the server as basic auth and nowhere else."""

from __future__ import annotations

import httpx
import pytest

from kimi_batch.llama.client import LlamaClient
from kimi_batch.llama.exceptions import LlamaError
from kimi_batch.llama.urls import redact_url, url_credentials

URL = "http://batch:s3cr%40t@127.0.0.1:8081/"


def test_redact_and_credentials() -> None:
    assert redact_url(URL) == "http://127.0.0.1:8081"
    assert redact_url("http://[::1]:8081/v1") == "http://[::1]:8081/v1"
    assert redact_url("http://u:p@[::1]:8081") == "http://[::1]:8081"
    assert url_credentials(URL) == ("batch", "s3cr@t")
    assert url_credentials("http://127.0.0.1:8081") is None


async def test_the_client_sends_basic_auth_and_shows_no_credentials() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(500, json={"error": {"message": "boom"}})

    async with LlamaClient(URL, transport=httpx.MockTransport(handler)) as client:
        with pytest.raises(LlamaError) as caught:
            await client.props()

    assert client.base_url == "http://127.0.0.1:8081"
    assert "s3cr" not in str(caught.value)
    assert seen
    assert all(r.headers["authorization"].startswith("Basic ") for r in seen)
    assert all("s3cr" not in str(r.url) for r in seen)
