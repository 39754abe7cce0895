"""`make trino-cli`: the Trino CLI of the server's version, on the configured catalog and schema."""

from __future__ import annotations

import os
import subprocess

import pytest

from kimi_batch.storage import TrinoPublisher
from kimi_batch_tests.support.repo import REPO_ROOT
from kimi_batch_tests.support.rows import amplified, distilled
from kimi_batch_tests.support.trino import TrinoServer

pytestmark = pytest.mark.slow


def test_make_trino_cli_queries_the_schema_without_qualifying_names(
    trino_server: TrinoServer,
) -> None:
    warehouse, config = trino_server.isolated("t_trino_cli")
    rows = distilled(amplified(3))
    warehouse.write_partition("distilled", "2024-05-02", "cli", rows)
    with TrinoPublisher(config) as publisher:
        publisher.publish_partition(warehouse, "distilled", "2024-05-02", "cli")

    env = {
        **os.environ,
        "KIMI_BATCH_TRINO_PORT": str(trino_server.port),
        "KIMI_BATCH_TRINO_SCHEMA": "t_trino_cli",
    }
    result = subprocess.run(
        [
            "make",
            "-s",
            "trino-cli",
            "TRINO_CLI_ARGS=--output-format CSV_UNQUOTED --execute "
            '"SELECT current_catalog, current_schema; SELECT count(*) FROM distilled"',
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines() == ["hive,t_trino_cli", str(len(rows))], result.stdout
