"""pytest plugin: the real code location on one Dagster webserver + daemon, shared by the
session's end-to-end tests (the UI's webserver tests, the Batch API's full stack).

A stack costs 15-30 s to start on 2 cores and its daemon ticks while it runs, so the session has
one, and the tests that ask for it run last (collection moves them to the end, in their order), so
it never idles beside the rest of the suite. It runs with the session llama-server's variables
(`llama_env`), Trino over that state dir (`llama_trino`) and a Batch API key: what every test asking
for it needs. Each test has its own partitions or batches and reads only its own runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kimi_batch_tests.support.dagster_stack import DagsterStack
from kimi_batch_tests.support.llama_server import LlamaEnv
from kimi_batch_tests.support.repo import REPO_ROOT
from kimi_batch_tests.support.trino import TrinoServer

__all__ = ["API_KEY", "KimiBatchStack", "kimi_batch_stack"]

API_KEY = "sk-full-stack"
FIXTURE = "kimi_batch_stack"


@dataclass(frozen=True)
class KimiBatchStack:
    """The running stack, the DAGSTER_HOME it serves, and the llama-server it uses."""

    dagster: DagsterStack
    dagster_home: Path
    llama: LlamaEnv


@pytest.fixture(scope="session")
def kimi_batch_stack(
    llama_env: LlamaEnv, llama_trino: TrinoServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KimiBatchStack]:
    """`workspace.yaml`'s code location on a webserver + daemon over the repo's dagster.yaml."""
    variables = {
        "KIMI_BATCH_API_KEY": API_KEY,
        "KIMI_BATCH_TRINO_HOST": llama_trino.host,
        "KIMI_BATCH_TRINO_PORT": str(llama_trino.port),
    }
    home = tmp_path_factory.mktemp("kimi_batch_stack") / "dagster_home"
    with pytest.MonkeyPatch.context() as patch:
        for name, value in variables.items():
            patch.setenv(name, value)
        patch.delenv("KIMI_BATCH_WAREHOUSE", raising=False)
        with DagsterStack(
            home, workspace=REPO_ROOT / "workspace.yaml", location="kimi_batch"
        ) as stack:
            yield KimiBatchStack(dagster=stack, dagster_home=home, llama=llama_env)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests on the shared stack last, in their order."""
    on_stack = [item for item in items if FIXTURE in getattr(item, "fixturenames", ())]
    if on_stack:
        rest = [item for item in items if FIXTURE not in getattr(item, "fixturenames", ())]
        items[:] = rest + on_stack
