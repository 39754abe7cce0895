"""Who reaches the Batch API: the key on every route, known Host names only, no cross-origin call.

The real app over a real uvicorn on a loopback port; hostile requests are raw httpx, as a local
user or a web page (DNS rebinding, a cross-origin form) would send them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import httpx
import openai
import pytest
from starlette.routing import BaseRoute, Route

from kimi_batch.batch_api import ApiStore
from kimi_batch.batch_api.web import ApiAccess, create_app
from kimi_batch.settings import Settings
from kimi_batch_tests.support.api_server import serving_api
from kimi_batch_tests.support.batches import MODEL

KEY = "sk-guard-test"
AUTH = {"Authorization": f"Bearer {KEY}"}


def jsonl(*custom_ids: str) -> bytes:
    rows = [
        {
            "custom_id": custom_id,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": MODEL, "messages": [{"role": "user", "content": "Hi."}]},
        }
        for custom_id in custom_ids
    ]
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("KIMI_BATCH_API_KEY", raising=False)
    monkeypatch.setenv("KIMI_BATCH_API_ALLOWED_HOSTS", "batch.internal, api.example:8443")
    return Settings.from_env()


@pytest.fixture
def keyed(settings: Settings) -> Iterator[str]:
    access = ApiAccess(key=KEY, bound_host="127.0.0.1", allowed_hosts=settings.api_allowed_hosts)
    with serving_api(settings, access) as url:
        yield url


@pytest.fixture
def open_url(settings: Settings) -> Iterator[str]:
    """Served with `--no-auth`: only the Host and origin checks stand."""
    with serving_api(settings, ApiAccess(key=None, bound_host="127.0.0.1")) as url:
        yield url


def root(base_url: str) -> str:
    return base_url.removesuffix("/v1")


def _flatten(routes: Iterable[BaseRoute]) -> Iterator[BaseRoute]:
    for route in routes:
        # FastAPI keeps an included router whole, as one entry holding its routes.
        nested = getattr(route, "original_router", None)
        if nested is not None:
            yield from _flatten(nested.routes)
        else:
            yield route


def every_route(settings: Settings) -> list[tuple[str, str]]:
    """(method, concrete path) of every route the app has, so a new one cannot escape."""
    app = create_app(settings, ApiAccess(key=KEY, bound_host="127.0.0.1"))
    found = []
    for route in _flatten(app.routes):
        assert isinstance(route, Route), route  # a Mount or a websocket route would need a case
        path = re.sub(r"\{[^}]+\}", "x-1", route.path)
        found += [(method, path) for method in sorted(route.methods or ())]
    documented = {re.sub(r"\{[^}]+\}", "x-1", path) for path in app.openapi()["paths"]}
    assert documented <= {path for _, path in found}
    return found


def test_every_route_docs_and_openapi_included_needs_the_key(
    keyed: str, settings: Settings
) -> None:
    routes = every_route(settings)
    assert ("GET", "/openapi.json") in routes
    assert ("POST", "/v1/batches/x-1/cancel") in routes
    assert ("DELETE", "/v1/files/x-1") in routes
    routes += [("GET", "/docs"), ("GET", "/redoc"), ("GET", "/v2/anything")]
    for key in (None, "sk-wrong", KEY + "x"):
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        for method, path in routes:
            response = httpx.request(method, root(keyed) + path, headers=headers)
            assert response.status_code == 401, (method, path, key, response.text)
            if method == "HEAD":
                continue
            error = response.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}
            assert error["code"] == "invalid_api_key"
    assert httpx.get(root(keyed) + "/openapi.json", headers=AUTH).status_code == 200
    lower = {"Authorization": f"bearer  {KEY}"}  # the scheme is case-insensitive
    assert httpx.get(f"{keyed}/files", headers=lower).status_code == 200
    with pytest.raises(ValueError, match="at least 1 character"):
        ApiAccess(key="", bound_host="127.0.0.1")  # an empty key would match a missing header


def test_a_delete_without_the_key_deletes_nothing(keyed: str, settings: Settings) -> None:
    client = openai.OpenAI(base_url=keyed, api_key=KEY, max_retries=0)
    upload = client.files.create(file=("in.jsonl", jsonl("a")), purpose="batch")
    assert httpx.delete(f"{keyed}/files/{upload.id}").status_code == 401
    assert client.files.content(upload.id).read() == jsonl("a")
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=keyed, api_key="sk-wrong", max_retries=0).files.list()


@pytest.mark.parametrize(
    "host", ["attacker.example", "attacker.example:8090", "127.0.0.1.nip.io", "localhost:x", ""]
)
def test_an_unknown_host_is_refused_before_the_key_or_the_body(keyed: str, host: str) -> None:
    # DNS rebinding: the browser sends the attacker's name, the key is never even looked at.
    for headers in ({"Host": host}, {"Host": host, **AUTH}):
        response = httpx.post(f"{keyed}/batches", headers=headers, content=b"{" * 10_000)
        assert response.status_code == 421, (host, response.text)
        assert response.json()["error"]["code"] == "unknown_host"


ANSWERED = ["localhost", "LOCALHOST:8090", "127.0.0.1", "[::1]:8090", "[::1]", "::1"]
ALLOWED = ["batch.internal", "batch.internal:9", "api.example:8443", "api.example"]


@pytest.mark.parametrize("host", ANSWERED + ALLOWED)
def test_loopback_names_and_the_allowed_hosts_are_answered(keyed: str, host: str) -> None:
    response = httpx.get(f"{keyed}/files", headers={"Host": host, **AUTH})
    assert response.status_code == 200, (host, response.text)


def _batch(base_url: str, key: str | None) -> str:
    client = openai.OpenAI(base_url=base_url, api_key=key or "unused", max_retries=0)
    upload = client.files.create(file=("in.jsonl", jsonl("a", "b")), purpose="batch")
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert batch.status == "validating"
    return batch.id


def _status(settings: Settings, batch_id: str) -> str:
    with ApiStore(settings.paths) as store:
        record = store.batch(batch_id)
    assert record is not None
    return record.status.value


def test_a_cross_origin_cancel_is_refused_even_without_auth(
    open_url: str, settings: Settings
) -> None:
    batch_id = _batch(open_url, None)
    cancel = f"{open_url}/batches/{batch_id}/cancel"
    # What any web page can send without a preflight: a "simple" text/plain POST.
    simple = {"Content-Type": "text/plain", "Origin": "http://attacker.example"}
    assert httpx.post(cancel, headers=simple, content=b"{}").status_code == 403
    assert httpx.post(cancel, headers={"Origin": "null"}).status_code == 403
    fetch = {"Sec-Fetch-Site": "cross-site", "Content-Type": "application/json"}
    assert httpx.post(cancel, headers=fetch).status_code == 403
    # Without Origin, a text/plain body is still not JSON: 415.
    plain = httpx.post(cancel, headers={"Content-Type": "text/plain"}, content=b"{}")
    assert plain.status_code == 415
    assert _status(settings, batch_id) == "validating"
    # Same origin (a page served by this host) and plain clients are answered.
    same = {"Origin": root(open_url), "Content-Type": "application/json"}
    assert httpx.post(cancel, headers=same, content=b"{}").status_code == 200
    assert _status(settings, batch_id) == "cancelling"
    client = openai.OpenAI(base_url=open_url, api_key="unused", max_retries=0)
    assert client.batches.cancel(batch_id).status == "cancelling"
    assert httpx.post(cancel).status_code == 200  # no body, no type: fine


def test_a_preflight_is_refused_on_every_route(keyed: str, settings: Settings) -> None:
    for _, path in every_route(settings):
        preflight = {
            "Origin": "http://attacker.example",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        }
        for headers in (preflight, {**preflight, **AUTH}, AUTH):
            response = httpx.options(root(keyed) + path, headers=headers)
            assert response.status_code == 403, (path, response.text)
            assert "access-control-allow-origin" not in response.headers


def test_creating_a_batch_needs_a_json_body(keyed: str) -> None:
    client = openai.OpenAI(base_url=keyed, api_key=KEY, max_retries=0)
    upload = client.files.create(file=("in.jsonl", jsonl("a")), purpose="batch")
    body = json.dumps(
        {"input_file_id": upload.id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    )
    for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {**AUTH, **({"Content-Type": content_type} if content_type else {})}
        response = httpx.post(f"{keyed}/batches", headers=headers, content=body)
        assert response.status_code == 415, (content_type, response.text)
    response = httpx.post(
        f"{keyed}/batches",
        headers={**AUTH, "Content-Type": "application/json; charset=utf-8"},
        content=body,
    )
    assert response.status_code == 200, response.text
    assert [b.id for b in client.batches.list()] == [response.json()["id"]]
