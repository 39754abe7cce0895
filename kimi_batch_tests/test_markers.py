"""The guards of the `slow` tier: a test reaching a server fixture must be marked slow, and one
marked to run beside llama-server's may not ask for one."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from kimi_batch_tests.support.markers import marked_items_with_llama_fixtures, unmarked_server_tests


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


def test_a_test_marked_beside_llama_server_requesting_a_llama_fixture_is_reported() -> None:
    slow = {"slow": pytest.mark.slow}
    beside = {**slow, "no_llama_server": pytest.mark.no_llama_server}
    items = [
        FakeItem("t::trino", ["trino_server"], beside),
        FakeItem("t::binary", ["tmp_path", "llama_binary"], beside),
        FakeItem("t::server", ["llama_env"], slow),
    ]
    assert marked_items_with_llama_fixtures(items) == ["t::binary"]
