"""The guard of the `slow` tier: a test reaching a server fixture must be marked slow."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from kimi_batch_tests.support.markers import unmarked_server_tests


@dataclass
class FakeItem:
    nodeid: str
    fixturenames: list[str]
    markers: dict[str, pytest.MarkDecorator] = field(default_factory=dict)

    def get_closest_marker(self, name: str) -> pytest.MarkDecorator | None:
        return self.markers.get(name)


def test_only_unmarked_tests_that_reach_a_server_are_reported() -> None:
    items = [
        FakeItem("t::pure", ["tmp_path"]),
        FakeItem("t::server_unmarked", ["tmp_path", "shared_server", "llama_env"]),
        FakeItem("t::server_marked", ["trino_server"], {"slow": pytest.mark.slow}),
        FakeItem("t::binary_only", ["llama_binary"]),
    ]
    assert unmarked_server_tests(items) == ["t::server_unmarked", "t::binary_only"]
