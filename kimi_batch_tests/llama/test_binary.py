"""Finding llama.cpp's tools: a configured build's own beside its llama-server, else the bundled."""

from __future__ import annotations

from pathlib import Path

import pytest

from kimi_batch.llama import ServerSpawnError, find_tool
from kimi_batch.llama.binary import bundled_llama_server


def _executable(path: Path, mode: int = 0o755) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(mode)
    return path


def test_the_tool_beside_a_configured_llama_server_comes_first(tmp_path: Path) -> None:
    server = _executable(tmp_path / "ik_llama.cpp" / "build" / "bin" / "llama-server")
    bench = _executable(server.with_name("llama-bench"))

    assert find_tool("llama-bench", beside=server) == bench


def test_without_one_beside_it_the_bundled_build_answers(tmp_path: Path) -> None:
    server = _executable(tmp_path / "bin" / "llama-server")
    _executable(server.with_name("llama-batched-bench"), mode=0o644)  # not executable
    bundled = bundled_llama_server()
    assert bundled is not None

    assert find_tool("llama-bench", beside=server) == bundled.with_name("llama-bench")
    assert find_tool("llama-batched-bench", beside=server) == bundled.with_name(
        "llama-batched-bench"
    )


def test_an_explicit_path_wins_and_a_missing_one_is_refused(tmp_path: Path) -> None:
    server = _executable(tmp_path / "bin" / "llama-server")
    _executable(server.with_name("llama-bench"))
    mine = _executable(tmp_path / "elsewhere" / "llama-bench")

    assert find_tool("llama-bench", str(mine), beside=server) == mine
    with pytest.raises(ServerSpawnError, match="not found"):
        find_tool("llama-bench", str(tmp_path / "nowhere"), beside=server)
