"""A user's own llama.cpp build, for the tests of the commands that run its tools."""

from __future__ import annotations

from pathlib import Path

from kimi_batch.llama.binary import bundled_llama_server


def own_build(folder: Path, calls: Path) -> Path:
    """A user's own llama.cpp build in `folder`: the bundled build's binaries behind scripts that
    log each run, its llama-batched-bench printing the way ik_llama.cpp's does (no JSON lines: the
    Markdown table, on stderr). Returns its llama-server."""
    bundled = bundled_llama_server()
    assert bundled is not None
    folder.mkdir()
    drop_json = 'for a; do shift; [ "$a" = --output-format ] && skip=1 && continue; '
    drop_json += '[ -n "$skip" ] && skip= && continue; set -- "$@" "$a"; done; '
    scripts = {
        "llama-server": f'exec {bundled} "$@"',
        "llama-bench": f'echo llama-bench "$@" >> {calls}; '
        f'exec {bundled.with_name("llama-bench")} "$@"',
        "llama-batched-bench": f'echo llama-batched-bench "$@" >> {calls}; {drop_json}'
        f'exec {bundled.with_name("llama-batched-bench")} "$@" 1>&2',
    }
    for name, body in scripts.items():
        script = folder / name
        script.write_text(f"#!/bin/sh\n{body}\n")
        script.chmod(0o755)
    return folder / "llama-server"
