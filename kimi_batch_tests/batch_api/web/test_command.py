"""`kimi-batch api` as users start it, in a child process: the key it makes and prints, reused
on the next start, and `--no-auth` with its one warning."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import openai
import pytest

from kimi_batch_tests.support.ports import free_port

pytestmark = [
    pytest.mark.slow,
    pytest.mark.no_llama_server,
]  # each test starts the command's own server in a child process

START_TIMEOUT_S = 60.0


@contextmanager
def api_command(home: Path, *flags: str) -> Iterator[tuple[str, Path]]:
    """`kimi-batch api FLAGS` on a free port: (its base URL, the file its stderr goes to)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KIMI_BATCH_")}
    env["KIMI_BATCH_HOME"] = str(home)
    log = home.parent / f"api-{port}.log"
    argv = [sys.executable, "-m", "kimi_batch.cli", "api", "--port", str(port), *flags]
    with log.open("w") as sink:
        process = subprocess.Popen(argv, env=env, stdout=sink, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert process.poll() is None, log.read_text()
            try:
                httpx.get(f"{url}/files", timeout=2)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
        yield url, log
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_the_first_start_makes_and_prints_the_key_file_and_later_starts_reuse_it(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    key_path = home / "api" / "key"
    with api_command(home) as (url, log):
        assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
        assert stat.S_IMODE(key_path.parent.stat().st_mode) == 0o700
        key = key_path.read_text().strip()
        printed = log.read_text()
        assert f"export OPENAI_API_KEY=$(cat {key_path})" in printed
        assert key not in printed
        assert httpx.get(f"{url}/files").status_code == 401
        assert httpx.get(url.removesuffix("/v1") + "/openapi.json").status_code == 401
        client = openai.OpenAI(base_url=url, api_key=key, max_retries=0)
        upload = client.files.create(file=("in.jsonl", b"{}\n"), purpose="batch")
    with api_command(home) as (url, log):
        assert key_path.read_text().strip() == key
        assert str(key_path) in log.read_text()
        client = openai.OpenAI(base_url=url, api_key=key, max_retries=0)
        assert [f.id for f in client.files.list()] == [upload.id]


def test_no_auth_on_loopback_serves_without_a_key_and_warns_once(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with api_command(home, "--no-auth") as (url, log):
        assert httpx.get(f"{url}/files").status_code == 200
        assert log.read_text().count("warning: --no-auth") == 1
        assert not (home / "api" / "key").exists()
