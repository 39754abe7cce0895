"""pytest plugin: the tests in two processes, with every llama-server in one of them.

`make test` runs two pytest processes side by side. The llama-server tests are about half idle
on 2 cores (waiting on a server, a subprocess, a stall period), so the second process takes the
server-free tier and then the slow tests that need no llama-server (Trino, PostgreSQL, Dagster
processes, the browser, stand-ins) beside the first. But two llama-servers on 2 cores thrash
each other and make the measured tests meaningless, so every slow test that may start or use one
stays in the first process, in order: `-m "slow and not no_llama_server"`. That is the default:
a slow test runs beside it only when it or its module is marked `no_llama_server`, and such a
test is checked to keep the promise: one that requests a llama fixture is refused at
collection, and one that starts a llama-server process (its environment carries the test's
token, which children inherit) fails.
The second process runs niced in a session of its own (the Makefile says why), so it takes the
first's idle CPU rather than slowing it.

(pytest-xdist's `--dist loadgroup` would say the same with one command, but its groups are
silently ignored under pytest 9.2: pytest-dev/pytest-xdist#1386.)
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kimi_batch_tests.support.markers import BESIDE_LLAMA_MARK as MARK
from kimi_batch_tests.support.markers import marked_items_with_llama_fixtures
from kimi_batch_tests.support.processes import processes_naming

__all__ = ["LlamaServerWatch"]

TOKEN_VARIABLE = "KIMI_BATCH_TESTS_NO_LLAMA_TOKEN"
POLL_S = 0.25


class LlamaServerWatch:
    """Watches /proc, while entered, for llama-server processes whose environment holds
    `TOKEN_VARIABLE=token` (set in this process's environment for the duration, so every child
    inherits it). `found`: the command lines seen."""

    def __init__(self) -> None:
        self.token = uuid.uuid4().hex
        self.found: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="llama-server-watch", daemon=True)

    def _scan(self) -> None:
        for command in processes_naming(self.token).values():
            if any(Path(argument).name == "llama-server" for argument in command.split(" ")[:2]):
                self.found.append(command.strip())

    def _watch(self) -> None:
        while not self._stop.wait(POLL_S) and not self.found:
            self._scan()

    def __enter__(self) -> LlamaServerWatch:
        os.environ[TOKEN_VARIABLE] = self.token
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        if not self.found:
            self._scan()
        os.environ.pop(TOKEN_VARIABLE, None)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARK}: a slow test that starts no llama-server, so it may run in a second process "
        "beside the tests that do (support/slow_split.py)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    refused = marked_items_with_llama_fixtures(items)
    if refused:
        raise pytest.UsageError(
            f"these tests are marked `{MARK}` but request a llama fixture:\n  "
            + "\n  ".join(refused)
        )


@pytest.fixture(autouse=True)
def no_llama_server_started_by_a_marked_test(request: pytest.FixtureRequest) -> Iterator[None]:
    node = request.node
    if node.get_closest_marker(MARK) is None or node.get_closest_marker("slow") is None:
        yield
        return
    with LlamaServerWatch() as watch:
        yield
    if watch.found:
        pytest.fail(
            f"marked `{MARK}` but started llama-server ({watch.found[0]}): remove the mark, so "
            "the test runs with the others that do, one server at a time",
            pytrace=False,
        )
