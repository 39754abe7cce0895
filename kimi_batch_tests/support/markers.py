"""The `slow` tier: which tests need a real server, so `make unit` (`-m "not slow"`) stays fast."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

import pytest

__all__ = [
    "LLAMA_GROUP",
    "OTHER_GROUP",
    "SERVER_FIXTURES",
    "mark_slow_groups",
    "slow_group",
    "unmarked_server_tests",
]

# Fixtures that start (or need) llama-server, Trino or the S3 server, directly or through another
# fixture. (`warehouse_kind` marks its own `s3` parameter slow.)
SERVER_FIXTURES = frozenset(
    {
        "llama_binary",
        "model_path",
        "llama_env",
        "shared_server",
        "trino_server",
        "home_trino",
        "llama_trino",
        "s3proxy_server",
    }
)


# `make test` runs the slow tier on two workers (`-n 2 --dist loadgroup`): every test that runs
# llama-server, or that the server's tests would notice, in one group on one worker, one at a time
# as before; the rest (Trino, s3proxy, PostgreSQL, child processes of the CLI, the crash sweep's
# killed workers) in the other group on the other worker beside them.
LLAMA_GROUP = "llama_server"
OTHER_GROUP = "no_llama_server"
# Fixtures through which a test reaches llama-server (or its model and binary).
LLAMA_FIXTURES = frozenset(
    {"llama_binary", "model_path", "llama_env", "shared_server", "llama_trino"}
)
# Tests that belong with the server's though they request none of those fixtures: one starts
# llama-server through the CLI, one scaffolds a file into the checkout's defs folder (every
# definitions load in the other worker would see it), one times a night on the stand-in.
LLAMA_GROUP_TESTS = (
    "test_starting_a_server_warns_of_the_clamp_once",
    "test_a_file_scaffolded_with_dg_loads",
    "test_the_window_stops_the_night_and_the_next_night_catches_up",
)


class _Item(Protocol):
    @property
    def nodeid(self) -> str: ...

    def get_closest_marker(self, name: str) -> Any: ...

    def add_marker(self, marker: Any) -> None: ...


def unmarked_server_tests(items: Iterable[_Item]) -> list[str]:
    """Ids of the collected tests that reach a server fixture but are not marked `slow`."""
    return [
        item.nodeid
        for item in items
        if SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ()))
        and item.get_closest_marker("slow") is None
    ]


def slow_group(item: _Item) -> str:
    """The xdist group of a slow test: with llama-server (serial, as ever) or beside it."""
    if LLAMA_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        return LLAMA_GROUP
    if any(name in item.nodeid for name in LLAMA_GROUP_TESTS):
        return LLAMA_GROUP
    return OTHER_GROUP


def mark_slow_groups(items: Iterable[_Item]) -> None:
    """Give each slow test its xdist group (`make test`'s `--dist loadgroup`); no other test."""
    for item in items:
        if item.get_closest_marker("slow") is not None:
            item.add_marker(pytest.mark.xdist_group(slow_group(item)))
