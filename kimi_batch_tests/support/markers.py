"""The `slow` tier: which tests need a real server, so `make unit` (`-m "not slow"`) stays fast."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

__all__ = ["SERVER_FIXTURES", "unmarked_server_tests"]

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
