"""`kimi-batch api` always has a key: generated and kept at the first start, `--no-auth` on
loopback only. Server-free: the command's own functions, the app served in a thread."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import httpx
import openai
import pytest

from kimi_batch.batch_api.web import resolve_access
from kimi_batch.batch_api.web.server import base_url, startup_text
from kimi_batch.cli.commands import main
from kimi_batch.errors import ConfigError
from kimi_batch.settings import Settings
from kimi_batch_tests.support.api_server import serving_api


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("KIMI_BATCH_API_KEY", raising=False)
    return Settings.from_env()


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_first_start_without_a_key_makes_a_private_key_and_says_where(
    settings: Settings,
) -> None:
    path = settings.paths.api_key_path
    assert not path.exists()
    access = resolve_access(settings, host="127.0.0.1")
    assert access.key_file == path
    assert mode(path) == 0o600
    assert mode(path.parent) == 0o700
    key = path.read_text().strip()
    assert access.key == key
    assert len(key) >= 40
    text = startup_text(access, base_url("127.0.0.1", 8090))
    assert str(path) in text
    assert f"export OPENAI_API_KEY=$(cat {path})" in text
    assert "export OPENAI_BASE_URL=http://127.0.0.1:8090/v1" in text
    assert key not in text  # the key itself is never printed
    # Later starts reuse it; another state dir gets another one.
    assert resolve_access(settings, host="127.0.0.1").key == key
    with serving_api(settings, access) as url:
        assert httpx.get(f"{url}/files").status_code == 401
        client = openai.OpenAI(base_url=url, api_key=path.read_text().strip(), max_retries=0)
        assert list(client.files.list()) == []


def test_a_key_file_others_can_read_is_refused(settings: Settings) -> None:
    resolve_access(settings, host="127.0.0.1")
    path = settings.paths.api_key_path
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        resolve_access(settings, host="127.0.0.1")
    path.write_text("\n")
    os.chmod(path, 0o600)
    with pytest.raises(ConfigError, match="empty"):
        resolve_access(settings, host="127.0.0.1")


def test_the_configured_key_is_used_and_no_file_is_made(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KIMI_BATCH_API_KEY", "sk-configured")
    access = resolve_access(Settings.from_env(), host="127.0.0.1")
    assert access.key == "sk-configured"
    assert access.key_file is None
    assert not settings.paths.api_key_path.exists()
    assert "KIMI_BATCH_API_KEY" in startup_text(access, "http://127.0.0.1:8090/v1")


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.10"])
def test_no_auth_off_loopback_is_refused_by_the_command(
    settings: Settings, host: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["api", "--no-auth", "--host", host, "--port", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kimi-batch: error: --no-auth is refused on")
    assert len(err.strip().splitlines()) == 1
    with pytest.raises(ConfigError):
        resolve_access(settings, host=host, no_auth=True)


def test_no_auth_on_loopback_answers_without_a_key_and_warns_once(settings: Settings) -> None:
    access = resolve_access(settings, host="127.0.0.1", no_auth=True)
    assert access.key is None
    assert not settings.paths.api_key_path.exists()
    text = startup_text(access, "http://127.0.0.1:8090/v1")
    assert text.count("warning") == 1
    assert "--no-auth" in text
    with serving_api(settings, access) as url:
        assert httpx.get(f"{url}/files").status_code == 200
        # Still no strangers: Host and origin checks stand without a key.
        assert httpx.get(f"{url}/files", headers={"Host": "evil.example"}).status_code == 421
