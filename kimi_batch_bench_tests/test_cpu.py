"""Where the CPU went: processes grouped by command line, their CPU seconds read from /proc, and
the server's generated tok/s over time read from its /metrics."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest

from kimi_batch.llama import ChatMessage, LlamaClient
from kimi_batch_bench.cpu import GROUPS, CpuSampler, TokenRateSampler, process_group
from kimi_batch_tests.support.llama_server import LlamaEnv

# Burns this much CPU, then exits: the sampler must count what a process used before it ended.
_BURN = "import time\nwhile time.process_time() < {seconds}: pass\n"


@pytest.mark.parametrize(
    ("argv", "group"),
    [
        (["/opt/llama/bin/llama-server", "--model", "m.gguf"], "llama_server"),
        (["/venv/bin/python", "/venv/bin/dagster-daemon", "run"], "daemon"),
        (["/venv/bin/python", "-m", "dagster", "api", "grpc", "--lazy-load"], "code_servers"),
        (["/venv/bin/python", "-m", "dagster", "code-server", "start"], "code_servers"),
        (["/venv/bin/python", "-m", "dagster", "api", "execute_run", "{}"], "run_worker"),
        (["/venv/bin/python", "/venv/bin/dagster-webserver", "-p", "3000"], "webserver"),
        (["java", "-cp", "/cache/trino-server-476/lib/*", "io.trino.server.TrinoServer"], "trino"),
        (["/usr/bin/bash", "-c", "make test"], "other"),
        ([], "other"),
    ],
)
def test_a_process_is_grouped_by_its_command_line(argv: list[str], group: str) -> None:
    assert process_group(argv, pid=10, bench_pid=1) == group
    assert group in GROUPS


def test_the_bench_itself_is_its_own_group_whatever_its_command_line() -> None:
    argv = ["/venv/bin/python", "-m", "dagster", "api", "grpc"]
    assert process_group(argv, pid=42, bench_pid=42) == "bench"


def test_a_process_that_ends_between_samples_keeps_the_cpu_it_used() -> None:
    # `exec -a` names the burner llama-server, so its seconds land in that group.
    burner = ["bash", "-c", f'exec -a llama-server {sys.executable} -c "$0"']
    with CpuSampler(interval_s=0.1) as sampler:
        child = subprocess.Popen([*burner, _BURN.format(seconds=0.6)])
        assert child.wait(timeout=60) == 0
        time.sleep(0.05)
    split = sampler.split()
    counted = sampler.process(child.pid)
    assert counted is not None
    group, seconds = counted
    assert group == "llama_server"
    # Up to one interval of the child's last CPU may be missed; it burned 0.6 s in all.
    assert 0.4 <= seconds <= 0.8
    assert split.by_group["llama_server"] >= seconds  # other servers on the box count too
    assert split.machine_s >= split.by_group["llama_server"]
    assert split.wall_s > 0
    figures = split.as_json()
    assert set(figures) == {*GROUPS, "machine", "wall"}


def _sampled_code_server(parent_code: str, command: str = "api grpc") -> tuple[CpuSampler, str]:
    """Runs `parent_code` as a process named like Dagster's code server (`dagster <command>`),
    sampled until it ends; the sampler and what the process printed."""
    code_server = ["bash", "-c", f'exec -a dagster {sys.executable} -c "$0" {command}', parent_code]
    with CpuSampler(interval_s=0.05) as sampler:
        parent = subprocess.Popen(code_server, stdout=subprocess.PIPE, text=True)
        printed, _ = parent.communicate(timeout=60)
        assert parent.returncode == 0
    counted = sampler.process(parent.pid)
    assert counted is not None
    assert counted[0] == "code_servers"
    return sampler, printed


# The child's pid, printed by the parent: its own group and seconds are asserted, not the
# machine's groups (the other test tiers run real code servers and run workers beside this one).
_FORK_AND_PRINT = "import os, sys, time\ntime.sleep(0.3)\nchild = os.fork()\n"
_WAIT_FOR_CHILD = (
    "print(child, flush=True)\nsys.exit(os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]))\n"
)


def _child_of(sampler: CpuSampler, printed: str) -> tuple[str, float]:
    counted = sampler.process(int(printed.strip()))
    assert counted is not None
    return counted


def test_a_code_servers_unnamed_child_is_a_run_worker() -> None:
    # Dagster's code server starts a run's worker as a multiprocessing child whose command line
    # names no dagster: the sampler counts it by its parent.
    parent_code = (
        "import subprocess, time\n"
        "time.sleep(0.4)\n"
        # Its own sys.executable is lost with `exec -a`: the interpreter is named.
        f"child = subprocess.Popen([{sys.executable!r}, '-c', {_BURN.format(seconds=0.3)!r}])\n"
        "print(child.pid, flush=True)\n"
        "assert child.wait() == 0\n"
    )
    group, seconds = _child_of(*_sampled_code_server(parent_code))
    assert group == "run_worker"
    assert seconds >= 0.2


def test_a_code_servers_forked_child_is_a_run_worker_not_a_second_code_server() -> None:
    # A child seen between fork and exec (or forked by `multiprocessing` and never exec'd) still
    # shows the code server's own command line: it is the code server's run worker all the same.
    parent_code = (
        _FORK_AND_PRINT + "if child == 0:\n"
        "    end = time.process_time() + 0.4\n"
        "    while time.process_time() < end: pass\n"
        "    os._exit(0)\n" + _WAIT_FOR_CHILD
    )
    group, seconds = _child_of(*_sampled_code_server(parent_code))
    assert group == "run_worker"
    assert seconds >= 0.25


def test_a_child_that_execs_a_code_server_is_a_code_server_though_first_seen_as_a_fork() -> None:
    # `dagster code-server start` runs its `dagster api grpc` as a child: sampled between fork and
    # exec it shows the parent's command line (a run worker's sign), after the exec its own.
    grpc_code = _BURN.format(seconds=0.3)
    parent_code = (
        _FORK_AND_PRINT + "if child == 0:\n"
        "    time.sleep(0.4)\n"  # sampled several times before the exec
        f"    os.execv({sys.executable!r}, ['dagster', '-c', {grpc_code!r}, 'api', 'grpc'])\n"
        + _WAIT_FOR_CHILD
    )
    group, seconds = _child_of(*_sampled_code_server(parent_code, "code-server start"))
    assert group == "code_servers"
    assert seconds >= 0.2


def test_a_process_running_before_the_start_counts_only_what_it_used_after() -> None:
    before = subprocess.Popen(
        [sys.executable, "-c", "import time\ntime.sleep(30)"], stdout=subprocess.DEVNULL
    )
    try:
        time.sleep(0.3)
        with CpuSampler(interval_s=0.1) as sampler:
            # This process's own work is the bench's.
            end = time.process_time() + 0.3
            while time.process_time() < end:
                pass
        split = sampler.split()
        assert split.by_group.get("bench", 0.0) >= 0.25
        # The sleeper was already running (its interpreter start-up is not this span's).
        assert split.by_group.get("other", 0.0) < split.machine_s
    finally:
        before.kill()
        before.wait()


@pytest.mark.slow
def test_the_server_rate_follows_what_it_generates(llama_env: LlamaEnv) -> None:
    async def generate() -> int:
        async with LlamaClient(llama_env.base_url) as client:
            messages = [ChatMessage(role="user", content="Count from one to fifty in words.")]
            completion = await client.chat(messages, max_tokens=96, temperature=0.0)
            assert completion.usage is not None
            assert completion.usage.completion_tokens is not None
            return completion.usage.completion_tokens

    with TokenRateSampler(llama_env.base_url, interval_s=0.25) as rates:
        time.sleep(0.6)
        generated = asyncio.run(generate())
        time.sleep(0.6)
    assert generated > 0
    assert rates.points, "no /metrics sample"
    # The rates integrate to what the server generated while sampled (one request's tokens).
    times = [t for t, _ in rates.points]
    spans = [b - a for a, b in zip([times[0] - 0.25, *times[:-1]], times, strict=True)]
    counted = sum(rate * span for (_, rate), span in zip(rates.points, spans, strict=True))
    assert counted == pytest.approx(generated, rel=0.35)
    assert min(rate for _, rate in rates.points) == 0.0  # idle before and after
