"""Session fixtures (plugins in `support/`) and the guard that keeps `make unit` server-free.

`make unit` runs `pytest -m "not slow"`: the tier without llama-server, Trino, a webserver or a
child process, save one: the state tests' PostgreSQL (`support/postgres.py`), a cluster started
once per test process in about two seconds, as much the state's backend as SQLite is. A test that requests a real-server fixture without the `slow` mark would silently
start a server there, so collection refuses it.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings

from kimi_batch_tests.support.markers import unmarked_server_tests

pytest_plugins = [
    "kimi_batch_tests.support.llama_server",
    "kimi_batch_tests.support.s3proxy",  # before trino, which imports it (assert rewriting)
    "kimi_batch_tests.support.trino",
    "kimi_batch_tests.support.kimi_batch_stack",
    "kimi_batch_tests.support.postgres",
    "kimi_batch_tests.support.dagster_context",
    "kimi_batch_tests.support.slow_split",
    "kimi_batch_tests.support.inbox_files",
]

# Tests use dated inbox folders from 2025 on. Set before any test builds definitions from the
# environment (the date partitions start there), so they do not start at this run's install date.
os.environ.setdefault("KIMI_BATCH_PARTITIONS_START", "2025-01-01")

# The property tests draw the same examples on every run (`make test`, CI): a rare case one of
# them finds must fail the change that made it, not a later one by chance. To search for new
# cases, run them with HYPOTHESIS_PROFILE=explore (random draws, and the examples that failed
# before replayed first). No time limit per example in either (every property test also says
# `deadline=None`; this keeps a new one from missing it): `make test` runs them niced beside
# llama-server, where an example's time says nothing about the code, and a limit missed once
# fails a passing test as flaky.
for name, derandomize in (("repeatable", True), ("explore", False)):
    hypothesis_settings.register_profile(
        name,
        derandomize=derandomize,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    unmarked = unmarked_server_tests(items)
    if unmarked:
        raise pytest.UsageError(
            "these tests need a real server but are not marked slow "
            "(add `@pytest.mark.slow` or a module `pytestmark`):\n  " + "\n  ".join(unmarked)
        )
