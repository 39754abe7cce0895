"""Credentials in a server URL reach the server as basic auth and nowhere else."""

from __future__ import annotations

import httpx
import pytest

from kimi_batch.errors import ConfigError
from kimi_batch.llama.client import LlamaClient
from kimi_batch.llama.exceptions import LlamaError
from kimi_batch.llama.urls import redact_url, url_credentials
from kimi_batch.settings import Settings

URL = "http://batch:s3cr%40t@127.0.0.1:8081/"


def test_redact_and_credentials() -> None:
    assert redact_url(URL) == "http://127.0.0.1:8081"
    assert redact_url("http://[::1]:8081/v1") == "http://[::1]:8081/v1"
    assert redact_url("http://u:p@[::1]:8081") == "http://[::1]:8081"
    assert url_credentials(URL) == ("batch", "s3cr@t")
    assert url_credentials("http://127.0.0.1:8081") is None


@pytest.mark.parametrize("mark", ["/", "?", "#"])
def test_credentials_the_parser_cannot_find_are_hidden_and_refused(
    mark: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by review: a '/', '?' or '#' in an unescaped password ends the URL's host early,
    so the parser finds no user info and the password was shown whole (base_url, logs)."""
    url = f"http://bob:Xy{mark}9secret@127.0.0.1:8081"
    assert redact_url(url) == "http://(credentials)@127.0.0.1:8081"
    for variable in ("KIMI_BATCH_LLAMA_URL", "KIMI_BATCH_LLAMA_EXTRA_URLS"):
        with monkeypatch.context() as env:
            env.setenv(variable, url)
            with pytest.raises(ConfigError, match="percent-encode it") as refused:
                Settings.from_env()
        assert variable in str(refused.value)
        assert "9secret" not in str(refused.value)
    monkeypatch.setenv("KIMI_BATCH_LLAMA_EXTRA_URLS", "http://u:9secret@h:8081")
    assert "9secret" not in repr(Settings.from_env())


@pytest.mark.parametrize("port", ["abc", "99999", "0"])
def test_a_server_url_whose_port_no_client_can_use_is_one_config_error(
    port: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by review: accepted, then the client's construction raised a traceback (httpx's
    InvalidURL, or a ValueError with user info) out of every command."""
    for variable in ("KIMI_BATCH_LLAMA_URL", "KIMI_BATCH_LLAMA_EXTRA_URLS"):
        with monkeypatch.context() as env:
            env.setenv(variable, f"http://u:9secret@127.0.0.1:{port}")
            with pytest.raises(ConfigError, match="port must be a number from 1 to 65535") as bad:
                Settings.from_env()
        assert variable in str(bad.value)
        assert "9secret" not in str(bad.value)


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
