"""pytest plugin: a real PostgreSQL for the session (`scripts/postgres.sh`), and the state backends.

`state_backend` is the parameter the state-touching tests run under: `sqlite` (the embedded
default) and `postgresql` (a fresh database of the session's cluster per test, so tests never
see each other's rows). The cluster starts once per test process (~2 s), only when a test asks
for it; it gets its own KIMI_BATCH_HOME and a free loopback port. If it cannot start, the fixture
fails: the PostgreSQL tests are never silently skipped.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from kimi_batch.paths import StateLocation, StatePaths
from kimi_batch_tests.support.ports import free_port
from kimi_batch_tests.support.repo import REPO_ROOT
from kimi_batch_tests.support.script_server import script_server

__all__ = ["BACKENDS", "PostgresServer", "StateBackend", "postgres_server", "state_backend"]

SCRIPT = REPO_ROOT / "scripts" / "postgres.sh"
BACKENDS = ("sqlite", "postgresql")
# A fresh machine installs the package (apt-get) first.
START_TIMEOUT_S = 600


@dataclass(frozen=True, kw_only=True)
class PostgresServer:
    """The running test cluster."""

    home: Path
    url: str

    def new_database(self) -> str:
        """A fresh, empty database; its URL."""
        name = f"t_{uuid.uuid4().hex[:16]}"
        with psycopg.connect(self.url, autocommit=True) as db:
            db.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.url.rsplit("/", 1)[0] + f"/{name}"


@dataclass(frozen=True, kw_only=True)
class StateBackend:
    """Where a test's state lives: `database_url` None is the SQLite files under `home`."""

    name: str
    home: Path
    database_url: str | None

    @property
    def paths(self) -> StatePaths:
        return StatePaths(home=self.home, database_url=self.database_url)

    @property
    def ledger(self) -> StateLocation:
        return self.paths.ledger_state

    def apply(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Point this process's `Settings.from_env` at this backend."""
        monkeypatch.setenv("KIMI_BATCH_HOME", str(self.home))
        if self.database_url is None:
            monkeypatch.delenv("KIMI_BATCH_DATABASE_URL", raising=False)
        else:
            monkeypatch.setenv("KIMI_BATCH_DATABASE_URL", self.database_url)

    def env(self) -> dict[str, str]:
        """The environment of a child process on this backend."""
        env = {**os.environ, "KIMI_BATCH_HOME": str(self.home)}
        env.pop("KIMI_BATCH_DATABASE_URL", None)
        if self.database_url is not None:
            env["KIMI_BATCH_DATABASE_URL"] = self.database_url
        return env


@pytest.fixture(scope="session")
def postgres_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresServer]:
    """Start the cluster for the session and stop it at the end; fail (never skip)."""
    home = tmp_path_factory.mktemp("postgres_home")
    env = {**os.environ, "KIMI_BATCH_HOME": str(home), "KIMI_BATCH_POSTGRES_PORT": str(free_port())}
    log = home / "postgres" / "server.log"
    with script_server(SCRIPT, env, log=log, timeout_s=START_TIMEOUT_S) as run:
        yield PostgresServer(home=home, url=run("url").strip())


@pytest.fixture(params=BACKENDS)
def state_backend(request: pytest.FixtureRequest, tmp_path: Path) -> StateBackend:
    """The state's backend for this test: SQLite files, or a fresh PostgreSQL database."""
    home = tmp_path / "state"
    if request.param == "sqlite":
        return StateBackend(name="sqlite", home=home, database_url=None)
    server: PostgresServer = request.getfixturevalue("postgres_server")
    return StateBackend(name="postgresql", home=home, database_url=server.new_database())
