"""The slow tier's two processes (support plugin `slow_split`): the guard on the slow tests
marked to run beside the ones that use llama-server."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from kimi_batch_tests.support.child_pytest import run_child_pytest
from kimi_batch_tests.support.slow_split import LlamaServerWatch


def fake_llama_server(folder: Path) -> Path:
    """`sleep` under the name llama-server: what the watch looks for, without a model."""
    sleeper = shutil.which("sleep")
    assert sleeper is not None
    binary = folder / "bin" / "llama-server"
    binary.parent.mkdir(parents=True)
    shutil.copy(sleeper, binary)
    return binary


def test_the_watch_sees_a_server_started_inside_it_and_not_one_started_before(
    tmp_path: Path,
) -> None:
    binary = fake_llama_server(tmp_path)
    before = subprocess.Popen([str(binary), "30"])
    try:
        with LlamaServerWatch() as quiet:
            subprocess.run(["true"], check=True)
        assert quiet.found == []
        with LlamaServerWatch() as watch:
            inside = subprocess.Popen([str(binary), "30"])
            try:
                subprocess.run(["sleep", "1"], check=True)
            finally:
                inside.kill()
                inside.wait()
        assert len(watch.found) == 1
        assert watch.found[0] == f"{binary} 30"
    finally:
        before.kill()
        before.wait()


CHILD_TESTS = """
import subprocess
import time

import pytest

BINARY = {binary!r}


def start_a_server():
    server = subprocess.Popen([BINARY, "30"])
    try:
        time.sleep(1)
    finally:
        server.kill()
        server.wait()


@pytest.mark.slow
def test_in_the_llama_process():
    start_a_server()


@pytest.mark.slow
@pytest.mark.no_llama_server
def test_beside_it():
    pass


@pytest.mark.slow
@pytest.mark.no_llama_server
def test_marked_but_starts_a_server():
    start_a_server()


@pytest.mark.no_llama_server
def test_a_unit_test_in_a_marked_module_is_not_watched():
    start_a_server()
"""


def test_a_marked_slow_test_that_starts_a_server_fails_and_no_other_does(tmp_path: Path) -> None:
    binary = fake_llama_server(tmp_path)
    output = run_child_pytest(
        tmp_path / "test_child.py",
        CHILD_TESTS.format(binary=str(binary)),
        plugin="kimi_batch_tests.support.slow_split",
    )
    # The guard fails the test at teardown: an error on it, every test passed.
    assert "4 passed" in output, output
    assert "1 error" in output, output
    assert "ERROR test_child.py::test_marked_but_starts_a_server" in output
    assert "marked `no_llama_server` but started llama-server" in output
