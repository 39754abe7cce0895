"""pytest plugin: a real single-node Trino for the session (`scripts/trino.sh`).

The server gets its own KIMI_BATCH_HOME and a free loopback port, so it never touches `./var` or a
`make trino` server. Its Iceberg catalog is that home's: the ledger's SQLite file, the tables'
files under its warehouse folder. Tests write there through the warehouse, each in a namespace
(= Trino schema) of its own (`isolated`). If it cannot start, the fixture fails: the tests that
need Trino are never silently skipped (and are marked `slow`, which the conftest enforces).
"""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from collections.abc import Iterator, Mapping
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from trino.dbapi import connect

from kimi_batch.settings import Settings
from kimi_batch.warehouse import CatalogSpec, TrinoConfig, Warehouse, catalog_property_map
from kimi_batch_tests.support.llama_server import LlamaEnv
from kimi_batch_tests.support.ports import free_port
from kimi_batch_tests.support.repo import REPO_ROOT
from kimi_batch_tests.support.script_server import run_script

__all__ = [
    "TrinoServer",
    "catalog_over",
    "home_trino",
    "llama_trino",
    "running_trino",
    "trino_server",
]

SCRIPT = REPO_ROOT / "scripts" / "trino.sh"
# A fresh machine downloads ~800 MB from Maven Central before the first start.
START_TIMEOUT_S = 1800
READY_TIMEOUT_S = 240


@dataclass(frozen=True, kw_only=True)
class TrinoServer:
    """The running test Trino: its catalog is the ledger of `home`, its files in `warehouse`."""

    host: str
    port: int
    home: Path
    warehouse: Path
    # The server's catalog over `home`: the one its catalog file names, or one made for a test
    # by CREATE CATALOG (`catalog_over`).
    catalog: str = "iceberg"

    def config(self, **overrides: object) -> TrinoConfig:
        return TrinoConfig.model_validate(
            {"host": self.host, "port": self.port, "catalog": self.catalog, **overrides}
        )

    def env(self, schema: str) -> dict[str, str]:
        """A deployment's variables for this server's catalog, its tables in `schema`."""
        return {
            "KIMI_BATCH_HOME": str(self.home),
            "KIMI_BATCH_TRINO_HOST": self.host,
            "KIMI_BATCH_TRINO_PORT": str(self.port),
            "KIMI_BATCH_TRINO_CATALOG": self.catalog,
            "KIMI_BATCH_TRINO_SCHEMA": schema,
        }

    def isolated(self, name: str) -> tuple[Warehouse, TrinoConfig]:
        """The warehouse's tables in a namespace of `name`, and Trino on the schema of that
        name, so tests sharing the server don't mix."""
        if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
            raise ValueError(f"not an identifier: {name!r}")
        warehouse = Warehouse(CatalogSpec.for_folder(self.warehouse, namespace=name))
        return warehouse, self.config(schema_name=name)


def _run(command: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return run_script(SCRIPT, command, env, timeout)


def _log_tail(home: Path, lines: int = 40) -> str:
    log = home / "trino" / "log" / "server.log"
    if not log.exists():
        return "(no server.log)"
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


@contextmanager
def running_trino(
    home: Path,
    *,
    heap: str = "2G",
    deployment: Mapping[str, str] | None = None,
    dynamic_catalogs: bool = False,
) -> Iterator[TrinoServer]:
    """A Trino over the catalog of the state dir `home` (`scripts/trino.sh`), stopped on exit;
    fails the test (never skips) if it cannot start. `deployment`: the variables of a state
    kept elsewhere (KIMI_BATCH_DATABASE_URL, KIMI_BATCH_WAREHOUSE, S3), its catalog written
    from them. `dynamic_catalogs`: it also takes catalogs over other state dirs (`catalog_over`)."""
    port = free_port()
    env = {
        **os.environ,
        "KIMI_BATCH_HOME": str(home),
        "KIMI_BATCH_TRINO_PORT": str(port),
        "KIMI_BATCH_TRINO_TIMEOUT": str(READY_TIMEOUT_S),
        "KIMI_BATCH_TRINO_HEAP": heap,
        "KIMI_BATCH_TRINO_CATALOG_MANAGEMENT": "dynamic" if dynamic_catalogs else "static",
    }
    for name in ("KIMI_BATCH_WAREHOUSE", "KIMI_BATCH_DATABASE_URL", "KIMI_BATCH_TRINO_CATALOG"):
        env.pop(name, None)
    env.update(deployment or {})
    try:
        for command, timeout in (("start", START_TIMEOUT_S), ("wait", READY_TIMEOUT_S + 30)):
            result = _run(command, env, timeout)
            if result.returncode != 0:
                _run("stop", env, 60)
                pytest.fail(
                    f"scripts/trino.sh {command} failed ({result.returncode}):\n{result.stderr}\n"
                    f"{result.stdout}\n--- server.log ---\n{_log_tail(home)}",
                    pytrace=False,
                )
    except subprocess.TimeoutExpired as error:
        _run("stop", env, 60)
        pytest.fail(f"scripts/trino.sh timed out: {error}\n{_log_tail(home)}", pytrace=False)
    try:
        yield TrinoServer(host="127.0.0.1", port=port, home=home, warehouse=home / "warehouse")
    finally:
        _run("stop", env, 60)


@pytest.fixture(scope="session")
def trino_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TrinoServer]:
    """Trino for the session over a state dir of its own."""
    with running_trino(tmp_path_factory.mktemp("trino_home")) as server:
        yield server


def _sql_text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _run_sql(server: TrinoServer, statement: str) -> None:
    with closing(connect(host=server.host, port=server.port, user="kimi_batch")) as db:
        cursor = db.cursor()
        cursor.execute(statement)
        cursor.fetchall()


@contextmanager
def catalog_over(server: TrinoServer, settings: Settings) -> Iterator[TrinoServer]:
    """`server` (one with dynamic catalogs) reading the deployment `settings` through a catalog
    of its own, made as `kimi-batch publish --output` writes the file (`catalog_property_map`)
    and dropped on exit: a state dir's Trino without a server start each (~20 s on 2 cores)."""
    name = f"home_{uuid.uuid4().hex[:12]}"
    properties = catalog_property_map(settings)
    connector = properties.pop("connector.name")
    given = ", ".join(f'"{key}" = {_sql_text(value)}' for key, value in properties.items())
    _run_sql(server, f"CREATE CATALOG {name} USING {connector} WITH ({given})")
    try:
        yield TrinoServer(
            host=server.host,
            port=server.port,
            home=settings.paths.home,
            warehouse=settings.paths.warehouse_dir,
            catalog=name,
        )
    finally:
        _run_sql(server, f"DROP CATALOG {name}")


@pytest.fixture
def home_trino(tmp_path: Path, llama_trino: TrinoServer) -> Iterator[TrinoServer]:
    """Trino over the catalog of the test's own state dir, `tmp_path / "home"` (a test whose
    deployment writes there through the pipeline): a catalog of the session's server."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("KIMI_BATCH_HOME", str(tmp_path / "home"))
        for name in ("KIMI_BATCH_WAREHOUSE", "KIMI_BATCH_DATABASE_URL"):
            env.delenv(name, raising=False)
        settings = Settings.from_env()
    with catalog_over(llama_trino, settings) as server:
        yield server


@pytest.fixture(scope="session")
def llama_trino(llama_env: LlamaEnv) -> Iterator[TrinoServer]:
    """A Trino over the catalog of the session's llama state dir (tests that run the pipeline
    in `llama_env`'s home), beside `trino_server`; it takes other state dirs' catalogs too
    (`home_trino`, `catalog_over`)."""
    with running_trino(llama_env.home, heap="1G", dynamic_catalogs=True) as server:
        yield server
