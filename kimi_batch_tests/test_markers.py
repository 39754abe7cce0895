"""The guard of the `slow` tier: a test reaching a server fixture must be marked slow."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from kimi_batch_tests.support.markers import (
    LLAMA_GROUP,
    OTHER_GROUP,
    mark_slow_groups,
    slow_group,
    unmarked_server_tests,
)


@dataclass
class FakeItem:
    nodeid: str
    fixturenames: list[str]
    markers: dict[str, pytest.MarkDecorator] = field(default_factory=dict)

    def get_closest_marker(self, name: str) -> pytest.MarkDecorator | None:
        return self.markers.get(name)

    def add_marker(self, marker: pytest.MarkDecorator) -> None:
        self.markers[marker.name] = marker


def test_only_unmarked_tests_that_reach_a_server_are_reported() -> None:
    items = [
        FakeItem("t::pure", ["tmp_path"]),
        FakeItem("t::server_unmarked", ["tmp_path", "shared_server", "llama_env"]),
        FakeItem("t::server_marked", ["trino_server"], {"slow": pytest.mark.slow}),
        FakeItem("t::binary_only", ["llama_binary"]),
    ]
    assert unmarked_server_tests(items) == ["t::server_unmarked", "t::binary_only"]


def test_slow_tests_with_llama_server_share_one_group_and_the_rest_the_other() -> None:
    """`make test`'s two slow workers: everything near llama-server on one, one at a time."""
    groups = {
        item.nodeid: slow_group(item)
        for item in [
            FakeItem("t::attached", ["tmp_path", "llama_env"]),
            FakeItem("t::own_server", ["llama_binary", "model_path"]),
            FakeItem("t::trino_of_the_llama_home", ["llama_trino"]),
            FakeItem("t::trino", ["trino_server"]),
            FakeItem("t::s3", ["s3proxy_server", "tmp_path"]),
            FakeItem("t::child_process", ["tmp_path"]),
            FakeItem("cli/test_help.py::test_starting_a_server_warns_of_the_clamp_once", []),
            FakeItem("test_dg.py::test_a_file_scaffolded_with_dg_loads", ["tmp_path"]),
        ]
    }
    assert groups == {
        "t::attached": LLAMA_GROUP,
        "t::own_server": LLAMA_GROUP,
        "t::trino_of_the_llama_home": LLAMA_GROUP,
        "t::trino": OTHER_GROUP,
        "t::s3": OTHER_GROUP,
        "t::child_process": OTHER_GROUP,
        "cli/test_help.py::test_starting_a_server_warns_of_the_clamp_once": LLAMA_GROUP,
        "test_dg.py::test_a_file_scaffolded_with_dg_loads": LLAMA_GROUP,
    }


def test_each_slow_test_gets_its_group_and_no_other_test_one() -> None:
    items = [
        FakeItem("t::attached", ["llama_env"], {"slow": pytest.mark.slow}),
        FakeItem("t::trino", ["trino_server"], {"slow": pytest.mark.slow}),
        FakeItem("t::pure", ["tmp_path"]),
    ]
    mark_slow_groups(items)
    groups = {item.nodeid: item.markers.get("xdist_group") for item in items}
    assert {k: v.args if v else None for k, v in groups.items()} == {
        "t::attached": (LLAMA_GROUP,),
        "t::trino": (OTHER_GROUP,),
        "t::pure": None,
    }
