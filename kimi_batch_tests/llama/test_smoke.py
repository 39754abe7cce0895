"""`kimi-batch server smoke`, the last step of `make setup`: a crashing binary fails in one line.

The crash needs a stand-in (a real llama-server cannot be made to segfault on demand); the pass is
the real llama-server on the real SmolLM2 model.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kimi_batch_tests.support.cli import assert_one_error_line, run_cli
from kimi_batch_tests.support.crashing_binary import crashing_binary, exiting_binary

pytestmark = pytest.mark.slow  # each test runs the CLI, and a server or its stand-in, as children


@pytest.mark.no_llama_server  # no server started: runs beside the llama tier
def test_a_binary_killed_by_sigsegv_fails_the_smoke_test_in_one_line(tmp_path: Path) -> None:
    binary = crashing_binary(tmp_path, "SEGV")
    result = run_cli(tmp_path, "server", "smoke", KIMI_BATCH_LLAMA_SERVER=str(binary))
    assert_one_error_line(
        result,
        "killed by SIGSEGV",
        str(binary),
        "KIMI_BATCH_LLAMA_AMX=1",
        "KIMI_BATCH_LLAMA_SERVER",
    )
    log = tmp_path / "home" / "smoke" / "llama-server.log"
    assert str(log) in result.stderr
    assert "stand-in: loading model" in log.read_text()  # the binary's own output is kept


@pytest.mark.no_llama_server  # no server started: runs beside the llama tier
def test_a_binary_that_exits_fails_the_smoke_test_with_its_code(tmp_path: Path) -> None:
    binary = exiting_binary(tmp_path, 3)
    result = run_cli(tmp_path, "server", "smoke", KIMI_BATCH_LLAMA_SERVER=str(binary))
    assert_one_error_line(result, str(binary), "exited with code 3")
    assert "killed" not in result.stderr


def test_the_installed_llama_server_passes_the_smoke_test(
    tmp_path: Path, llama_binary: Path
) -> None:
    result = run_cli(
        tmp_path, "server", "smoke", "--json", KIMI_BATCH_LLAMA_SERVER=str(llama_binary)
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["binary"] == str(llama_binary)
    assert report["completion_tokens"] > 0
    print(f"smoke test of {llama_binary}: load {report['load_s']} s, wall {report['wall_s']} s")
    # The smoke server was stopped: no llama-server of this test is left on the machine.
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        assert str(tmp_path).encode() not in cmdline


def test_the_smoke_server_gets_the_flash_attention_the_server_will(
    tmp_path: Path, llama_binary: Path
) -> None:
    """So a build that refuses the flag fails the smoke test, not the night's start."""
    argv_log = tmp_path / "argv.log"
    wrapper = tmp_path / "bin" / "llama-server"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\necho "$@" >> {argv_log}\nexec {llama_binary} "$@"\n')
    wrapper.chmod(0o755)

    result = run_cli(
        tmp_path,
        "server",
        "smoke",
        KIMI_BATCH_LLAMA_SERVER=str(wrapper),
        KIMI_BATCH_LLAMA_FLASH_ATTN="on",
    )

    assert result.returncode == 0, result.stderr
    assert "--flash-attn on" in argv_log.read_text()
