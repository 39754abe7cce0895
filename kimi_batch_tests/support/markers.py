"""The `slow` tier: which tests need a real server, so `make unit` (`-m "not slow"`) stays fast;
and which slow tests may run beside llama-server's (support/slow_split.py)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

__all__ = [
    "BESIDE_LLAMA_MARK",
    "LLAMA_FIXTURES",
    "SERVER_FIXTURES",
    "marked_items_with_llama_fixtures",
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

# A slow test that starts no llama-server, so `make test` may run it beside those that do.
BESIDE_LLAMA_MARK = "no_llama_server"
# Fixtures that start llama-server or hand a test what it needs to start one.
LLAMA_FIXTURES = frozenset(
    {"llama_binary", "model_path", "llama_env", "shared_server", "llama_trino"}
)


class _Item(Protocol):
    @property
    def nodeid(self) -> str: ...

    def get_closest_marker(self, name: str) -> Any: ...


def unmarked_server_tests(items: Iterable[_Item]) -> list[str]:
    """Ids of the collected tests that reach a server fixture but are not marked `slow`."""
    return [
        item.nodeid
        for item in items
        if SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ()))
        and item.get_closest_marker("slow") is None
    ]


def marked_items_with_llama_fixtures(items: Iterable[_Item]) -> list[str]:
    """Ids of the tests marked `BESIDE_LLAMA_MARK` that request a llama fixture all the same."""
    return [
        item.nodeid
        for item in items
        if item.get_closest_marker(BESIDE_LLAMA_MARK) is not None
        and LLAMA_FIXTURES.intersection(getattr(item, "fixturenames", ()))
    ]
