"""The bench's tests use the runtime tests' server fixtures and the same guard of `make unit`.

The plugins and the environment are the ones `kimi_batch_tests/conftest.py` sets (a run of these
tests alone loads only this file); the guard refuses a test of this folder that reaches a real
server without the `slow` mark.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kimi_batch_tests.support.markers import unmarked_server_tests

pytest_plugins = [
    "kimi_batch_tests.support.llama_server",
    "kimi_batch_tests.support.s3proxy",  # before trino, which imports it (assert rewriting)
    "kimi_batch_tests.support.trino",
    "kimi_batch_tests.support.kimi_batch_stack",
    "kimi_batch_tests.support.postgres",
    "kimi_batch_tests.support.dagster_context",
    "kimi_batch_tests.support.slow_split",
]

os.environ.setdefault("KIMI_BATCH_PARTITIONS_START", "2025-01-01")

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    unmarked = unmarked_server_tests(item for item in items if item.path.is_relative_to(HERE))
    if unmarked:
        raise pytest.UsageError(
            "these tests need a real server but are not marked slow "
            "(add `@pytest.mark.slow` or a module `pytestmark`):\n  " + "\n  ".join(unmarked)
        )
