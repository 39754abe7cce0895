"""A real `dagster-webserver` + `dagster-daemon` for the end-to-end tests.

The daemon dequeues runs: every run goes through the queue of the repository's dagster.yaml. Both
run on a free loopback port in their own process group, killed on exit; `GraphQL` talks to them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Self

import dagster as dg
import httpx

from kimi_batch_tests.support.graphql import GraphQL
from kimi_batch_tests.support.ports import free_port
from kimi_batch_tests.support.processes import keep_niceness
from kimi_batch_tests.support.repo import REPO_ROOT

__all__ = ["DagsterStack"]


class DagsterStack:
    """`dagster-webserver` + `dagster-daemon` on a temporary DAGSTER_HOME with the repo's
    dagster.yaml, serving one code location; both are stopped (process group) on exit.
    """

    def __init__(
        self,
        dagster_home: Path,
        *,
        workspace: Path,
        location: str,
        env: Mapping[str, str] | None = None,
        startup_timeout_s: float = 240.0,
    ) -> None:
        self.dagster_home = dagster_home
        self.workspace = workspace
        self.location = location
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._env = {**os.environ, **(env or {}), "DAGSTER_HOME": str(dagster_home)}
        self._startup_timeout_s = startup_timeout_s
        self._processes: list[tuple[subprocess.Popen[bytes], Path]] = []
        self.graphql = GraphQL(self.base_url, location=location)

    def __enter__(self) -> Self:
        self.dagster_home.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO_ROOT / "dagster.yaml", self.dagster_home / "dagster.yaml")
        bin_dir = Path(sys.executable).parent
        # Create the SQLite databases once, before four processes (webserver, daemon and their
        # code servers) race to create them: concurrent first stamps corrupt alembic's table.
        # What `dagster instance migrate` does, in this process, where Dagster is imported
        # already: the CLI's own start costs ~13 s on 2 cores, for every stack.
        with dg.DagsterInstance.from_config(str(self.dagster_home)) as instance:
            instance.upgrade()
        try:
            self._spawn(
                "webserver",
                [
                    str(bin_dir / "dagster-webserver"),
                    *("-h", "127.0.0.1", "-p", str(self.port)),
                    *("-w", str(self.workspace)),
                ],
            )
            self._spawn(
                "daemon", [str(bin_dir / "dagster-daemon"), "run", "-w", str(self.workspace)]
            )
            self._wait_http()
            self.graphql.wait_loaded(self._startup_timeout_s)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.graphql.close()
        for process, _ in reversed(self._processes):
            _stop_group(process)
        self._processes.clear()

    def logs(self) -> str:
        """The last lines of each process's output, for assertion messages."""
        parts = []
        for process, log in self._processes:
            text = log.read_text(errors="replace") if log.exists() else ""
            parts.append(f"--- {log.name} (pid {process.pid}) ---\n" + text[-4000:])
        return "\n".join(parts)

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = self.dagster_home / f"{name}.log"
        with log.open("wb") as out:
            # Own session: the code servers and run workers they start share its process group,
            # so one killpg stops the whole tree and nothing outlives the test.
            process = subprocess.Popen(
                argv,
                cwd=self.workspace.parent,
                env=self._env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        keep_niceness(process.pid)
        self._processes.append((process, log))

    def _wait_http(self) -> None:
        deadline = time.monotonic() + self._startup_timeout_s
        while time.monotonic() < deadline:
            for process, log in self._processes:
                if process.poll() is not None:
                    raise AssertionError(
                        f"{log.name} exited with {process.returncode}:\n{self.logs()}"
                    )
            try:
                if httpx.get(f"{self.base_url}/server_info", timeout=5.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"webserver not up in {self._startup_timeout_s}s:\n{self.logs()}")


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group we created for `process`, SIGKILL what is left after 30 s."""
    try:
        pgid = os.getpgid(process.pid)
    except ProcessLookupError:
        process.wait()
        return
    for sig, wait_s in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        try:
            process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
        # The leader is gone; give the rest of the group a moment, then make sure.
        time.sleep(0.5)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        break
    if process.poll() is None:
        process.wait(timeout=10.0)
