"""The resident server's lifecycle through the real CLI and a real llama-server.

Each test gets its own state dir and port, so these servers never collide with the session's.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from kimi_batch_tests.support.crashing_binary import crashing_binary, exiting_binary
from kimi_batch_tests.support.ports import free_port
from kimi_batch_tests.support.processes import process_state

pytestmark = pytest.mark.slow  # every test drives `kimi-batch server` on a real llama-server


def _cli(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "kimi_batch.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"kimi-batch {' '.join(args)} failed:\n{result.stderr}")
    return result


def _env(home: Path, binary: Path, model: Path) -> dict[str, str]:
    env = {
        **os.environ,
        "KIMI_BATCH_HOME": str(home),
        "KIMI_BATCH_MODEL": str(model),
        "KIMI_BATCH_LLAMA_SERVER": str(binary),
        "KIMI_BATCH_LLAMA_PORT": str(free_port()),
        "KIMI_BATCH_LLAMA_THREADS": "1",
        "KIMI_BATCH_LLAMA_CTX": "2048",
        "KIMI_BATCH_LLAMA_PARALLEL": "1",
        # The digest, a question and the answer budget must fit the one 2,048-token slot.
        "KIMI_BATCH_LLAMA_N_PREDICT": "256",
    }
    env.pop("KIMI_BATCH_LLAMA_URL", None)
    return env


@pytest.fixture
def cli_env(tmp_path: Path, llama_binary: Path, model_path: Path) -> Iterator[dict[str, str]]:
    env = _env(tmp_path / "home", llama_binary, model_path)
    yield env
    _cli(env, "server", "stop", check=False)


def _start(env: dict[str, str]) -> dict[str, object]:
    return json.loads(_cli(env, "server", "start", "--json").stdout)


def _loads_in_log(env: dict[str, str]) -> int:
    log = Path(env["KIMI_BATCH_HOME"]) / "server" / "server.log"
    return log.read_text(errors="replace").count("=== kimi_batch spawn")


def test_second_start_attaches_to_the_same_pid_and_loads_nothing(cli_env: dict[str, str]) -> None:
    first = _start(cli_env)
    second = _start(cli_env)
    assert first["spawned"] is True
    assert second["spawned"] is False
    assert second["pid"] == first["pid"]
    assert _loads_in_log(cli_env) == 1

    status = json.loads(_cli(cli_env, "server", "status", "--json").stdout)
    assert status["running"] is True
    assert status["pid"] == first["pid"]
    assert status["base_url"] == first["base_url"]
    assert status["model"]
    assert status["threads"] == 1
    assert status["slots"] == 1


def test_two_concurrent_starts_yield_one_server(cli_env: dict[str, str]) -> None:
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda _: _start(cli_env), range(2)))
    assert results[0]["pid"] == results[1]["pid"]
    assert sorted(bool(r["spawned"]) for r in results) == [False, True]
    assert _loads_in_log(cli_env) == 1


def test_a_killed_server_is_respawned_by_the_next_start(cli_env: dict[str, str]) -> None:
    first = _start(cli_env)
    os.kill(int(str(first["pid"])), signal.SIGKILL)
    time.sleep(0.5)
    second = _start(cli_env)
    assert second["spawned"] is True
    assert second["pid"] != first["pid"]
    assert httpx.get(f"{second['base_url']}/health", timeout=5).status_code == 200


def test_a_frozen_server_is_replaced_by_the_next_start(cli_env: dict[str, str]) -> None:
    # A step that starts while the server is stopped (SIGSTOP): its pid lives, it served
    # before, and it answers nothing. The start replaces it instead of waiting for its health.
    first = _start(cli_env)
    pid = int(str(first["pid"]))
    os.kill(pid, signal.SIGSTOP)
    try:
        # Frozen after 10 s of silence (the default 60 s suits a loaded target): a stopped
        # server answers nothing however long the start waits.
        second = _start({**cli_env, "KIMI_BATCH_LLAMA_FROZEN_AFTER_S": "10"})
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert second["spawned"] is True
    assert second["pid"] != first["pid"]
    assert httpx.get(f"{second['base_url']}/health", timeout=5).status_code == 200


def test_a_server_killed_by_sigsegv_at_start_is_named_in_one_line(
    tmp_path: Path, model_path: Path
) -> None:
    binary = crashing_binary(tmp_path, "SEGV")  # as an AMX build dies on a Xeon
    cli_env = _env(tmp_path / "home", binary, model_path)
    result = _cli(cli_env, "server", "start", check=False)
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    log = Path(cli_env["KIMI_BATCH_HOME"]) / "server" / "server.log"
    assert "llama-server (pid " in line
    assert "was killed by SIGSEGV during the model load / first computation" in line
    assert f"log: {log}" in line
    assert "CPU instructions" in line
    assert "KIMI_BATCH_LLAMA_SERVER" in line
    status = json.loads(_cli(cli_env, "server", "status", "--json").stdout)
    assert status["running"] is False


def test_an_ordinary_exit_at_start_keeps_its_code_and_log_tail(
    tmp_path: Path, model_path: Path
) -> None:
    binary = exiting_binary(tmp_path, 3)
    result = _cli(_env(tmp_path / "home", binary, model_path), "server", "start", check=False)
    assert result.returncode == 2
    first, *tail = result.stderr.splitlines()
    assert "exited" in first
    assert "with code 3" in first
    assert "killed" not in result.stderr
    assert any("error: bad flag" in line for line in tail)


def test_a_server_killed_by_a_signal_later_is_named_when_it_is_started_again(
    cli_env: dict[str, str],
) -> None:
    first = _start(cli_env)
    os.kill(int(str(first["pid"])), signal.SIGSEGV)
    restarted = _cli(cli_env, "server", "start", "--json")
    second = json.loads(restarted.stdout)
    assert second["spawned"] is True
    warning = f"the previous llama-server (pid {first['pid']}) was killed by SIGSEGV after"
    assert warning in restarted.stderr
    assert "of serving" in restarted.stderr
    assert second["previous_exit"].startswith(f"llama-server (pid {first['pid']}) was killed")
    # A server stopped on purpose is not a death to report.
    _cli(cli_env, "server", "stop")
    again = _cli(cli_env, "server", "start", "--json")
    assert json.loads(again.stdout)["previous_exit"] is None
    assert "warning" not in again.stderr


def test_a_different_model_is_refused_and_the_running_server_is_left_alone(
    cli_env: dict[str, str], tmp_path: Path, model_path: Path
) -> None:
    first = _start(cli_env)
    other_model = tmp_path / "other-model.gguf"
    try:
        os.link(model_path, other_model)  # another model file as far as any spec can tell
    except OSError:
        shutil.copyfile(model_path, other_model)
    refused = _cli(
        {**cli_env, "KIMI_BATCH_MODEL": str(other_model)}, "server", "start", check=False
    )
    assert refused.returncode == 2
    assert "different spec" in refused.stderr
    assert str(model_path) in refused.stderr  # the running spec
    assert str(other_model) in refused.stderr  # the requested spec
    assert httpx.get(f"{first['base_url']}/health", timeout=5).status_code == 200


def test_stop_ends_the_server_and_removes_its_pid_file(cli_env: dict[str, str]) -> None:
    first = _start(cli_env)
    pid_file = Path(cli_env["KIMI_BATCH_HOME"]) / "server" / "server.pid"
    assert pid_file.is_file()
    assert "stopped" in _cli(cli_env, "server", "stop").stdout
    assert not pid_file.exists()
    assert process_state(int(str(first["pid"]))) in (None, "Z")
    status = json.loads(_cli(cli_env, "server", "status", "--json").stdout)
    assert status["running"] is False


def test_stop_ends_the_server_a_wrapper_script_runs_as_its_child(
    cli_env: dict[str, str], tmp_path: Path, llama_binary: Path
) -> None:
    """KIMI_BATCH_LLAMA_SERVER may be a user's wrapper that runs llama-server as its child, no
    `exec`: stop ended the shell alone and left the server serving on the port, unmanaged."""
    wrapper = tmp_path / "llama-wrapper"
    wrapper.write_text(f'#!/bin/sh\n"{llama_binary}" "$@"\nexit $?\n')
    wrapper.chmod(0o755)
    env = {**cli_env, "KIMI_BATCH_LLAMA_SERVER": str(wrapper)}
    base = str(_start(env)["base_url"])
    assert httpx.get(f"{base}/health", timeout=5).status_code == 200
    assert "stopped" in _cli(env, "server", "stop").stdout
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.get(f"{base}/health", timeout=2)
        except httpx.TransportError:
            break  # nothing listens any more
        time.sleep(0.2)
    else:
        pytest.fail(f"a llama-server still answers at {base} after stop")


def test_api_key_reaches_the_child_environment_not_its_argv(cli_env: dict[str, str]) -> None:
    env = {**cli_env, "KIMI_BATCH_LLAMA_API_KEY": "s3cret-key"}
    started = _start(env)
    pid = int(str(started["pid"]))
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode()
    assert "s3cret-key" not in cmdline
    assert b"LLAMA_API_KEY=s3cret-key" in Path(f"/proc/{pid}/environ").read_bytes()
    assert (
        "s3cret-key"
        not in (Path(env["KIMI_BATCH_HOME"]) / "server" / "server.spec.json").read_text()
    )
    base = str(started["base_url"])
    assert httpx.get(f"{base}/props", timeout=5).status_code == 401
    authorized = httpx.get(
        f"{base}/props", headers={"Authorization": "Bearer s3cret-key"}, timeout=5
    )
    assert authorized.status_code == 200


def _allowed_cpus(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"no Cpus_allowed_list for {pid}")


def test_a_pinned_server_runs_on_its_cpus_with_threads_that_fit_them(
    cli_env: dict[str, str],
) -> None:
    last = max(os.sched_getaffinity(0))
    env = {**cli_env, "KIMI_BATCH_LLAMA_CPUS": str(last), "KIMI_BATCH_LLAMA_THREADS": "13"}
    started = _start(env)
    pid = int(str(started["pid"]))
    assert _allowed_cpus(pid) == str(last)
    # Every thread of the server, not only its first, is on the set.
    for task in Path(f"/proc/{pid}/task").iterdir():
        assert _allowed_cpus(int(task.name)) == str(last)
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert argv[argv.index(b"--threads") + 1] == b"1"
    assert _cli(env, "server", "start").returncode == 0  # attaches: the same pinned spec


def test_a_cpu_list_the_machine_does_not_offer_is_refused_in_one_line(
    cli_env: dict[str, str],
) -> None:
    env = {**cli_env, "KIMI_BATCH_LLAMA_CPUS": "4096-4097"}
    result = _cli(env, "server", "start", check=False)
    assert result.returncode != 0
    assert "KIMI_BATCH_LLAMA_CPUS=4096-4097 names CPUs 4096-4097" in result.stderr
    assert "Traceback" not in result.stderr
