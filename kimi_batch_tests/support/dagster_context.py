"""pytest plugin: no test leaves a Dagster instance open in the test process's context.

Entering a `DagsterInstance` (`with instance:`, or a schedule context reading `context.instance`,
which opens one from the instance's ref) sets Dagster's defs-state storage as a context variable
until it is closed. A context left open leaks it to every later test: once that instance is
garbage collected, the next `Definitions` built from the `defs` folder fails with "Attempted to
resolve undefined DagsterInstance weakref" in a test that did nothing wrong (seen in the slow
tier after `build_schedule_context` without `with`). So each test runs with no storage set, and
one that leaves one behind fails itself, naming the cause.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from dagster._core.storage.defs_state.base import DefsStateStorage, set_defs_state_storage


@pytest.fixture(autouse=True)
def no_dagster_context_left_open() -> Iterator[None]:
    with set_defs_state_storage(None):
        yield
        left = DefsStateStorage.get()
    if left is not None:
        pytest.fail(
            f"the test left a Dagster instance's context open ({type(left).__name__} still set): "
            "close every `dg.build_schedule_context(...)` and entered instance with `with`",
            pytrace=False,
        )
