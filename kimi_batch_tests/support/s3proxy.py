"""pytest plugin: a real S3-compatible server for the session (`scripts/s3proxy.sh`), and the
warehouse kinds the storage contract's tests run under.

`warehouse_kind` is the parameter: `local` (the folder, the embedded default) and `s3` (a fresh
prefix of the session's s3proxy bucket per test, the pointers in the test's SQLite ledger). The
server starts once per test process (~3 s, Java), only when a test asks for it, with its own
KIMI_BATCH_HOME, a free loopback port and its own credentials, handed to the clients through the
AWS variables as a deployment would. If it cannot start the fixture fails: never a silent skip.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kimi_batch.paths import StatePaths
from kimi_batch.warehouse import CatalogSpec, Warehouse
from kimi_batch_tests.support.ports import free_port
from kimi_batch_tests.support.repo import REPO_ROOT
from kimi_batch_tests.support.script_server import script_server

__all__ = ["S3Server", "WarehouseFactory", "s3proxy_server", "warehouse_kind"]

SCRIPT = REPO_ROOT / "scripts" / "s3proxy.sh"
# A fresh machine fetches the jar (~55 MB) first.
START_TIMEOUT_S = 600
BUCKET = "kimi-batch"

WarehouseFactory = Callable[[Path], Warehouse]


@dataclass(frozen=True, kw_only=True)
class S3Server:
    """The running test server: its endpoint and the AWS variables its clients need."""

    home: Path
    endpoint: str
    env: dict[str, str]


@pytest.fixture(scope="session")
def s3proxy_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """Start s3proxy for the session and stop it at the end; fail (never skip)."""
    home = tmp_path_factory.mktemp("s3proxy_home")
    env = {**os.environ, "KIMI_BATCH_HOME": str(home), "KIMI_BATCH_S3PROXY_PORT": str(free_port())}
    log = home / "s3proxy" / "server.log"
    with script_server(SCRIPT, env, log=log, timeout_s=START_TIMEOUT_S) as run:
        variables = dict(line.split("=", 1) for line in run("env").splitlines() if "=" in line)
        endpoint = variables.pop("KIMI_BATCH_S3_ENDPOINT")
        yield S3Server(home=home, endpoint=endpoint, env=variables)


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.slow)])
def warehouse_kind(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> WarehouseFactory:
    """Makes this test's warehouse under a state dir: the local folder, or an s3:// prefix."""
    if request.param == "local":
        return lambda home: Warehouse(StatePaths(home=home).warehouse_dir)
    server: S3Server = request.getfixturevalue("s3proxy_server")
    for name, value in server.env.items():
        monkeypatch.setenv(name, value)
    prefix = f"s3://{BUCKET}/t-{uuid.uuid4().hex[:12]}"

    def object_warehouse(home: Path) -> Warehouse:
        local = CatalogSpec.for_folder(StatePaths(home=home).warehouse_dir)
        return Warehouse(
            local.model_copy(
                update={
                    "warehouse": prefix,
                    "s3_endpoint": server.endpoint,
                    "s3_region": server.env["AWS_REGION"],
                }
            )
        )

    return object_warehouse
