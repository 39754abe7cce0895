"""The command speaks to users: its help says what each command does, with no names from inside.

A configuration warning belongs to the command it concerns: the thread clamp is printed when a
server is started, never by `--help` or `status`.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kimi_batch.cli.commands import build_parser
from kimi_batch.llama import ServerSpec
from kimi_batch.llama.process import process_start_ticks
from kimi_batch_tests.support.cli import run_cli
from kimi_batch_tests.support.ports import free_port

# Names of the code a user never needs: classes, functions, modules, internal flags.
INTERNAL = re.compile(
    r"Settings|from_env|`main`|kimi_batch\.|ResidentServer|ServerSpec|Ledger|needs_settings"
    r"|contender|\(D\)|Dagster partition|func="
)
THREAD_WARNING = "exceeds the"


def _parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def _all_parsers() -> list[argparse.ArgumentParser]:
    return list(_parsers(build_parser()))


@pytest.mark.parametrize("parser", _all_parsers(), ids=lambda parser: parser.prog)
def test_each_commands_help_names_nothing_internal(parser: argparse.ArgumentParser) -> None:
    text = parser.format_help()
    assert not INTERNAL.search(text), f"{parser.prog} --help: {INTERNAL.search(text)}"


@pytest.mark.parametrize("parser", _all_parsers(), ids=lambda parser: parser.prog)
def test_every_option_and_command_says_what_it_does(parser: argparse.ArgumentParser) -> None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            assert all(choice.help for choice in action._choices_actions), parser.prog
        else:
            assert action.help, f"{parser.prog} {action.option_strings or action.dest}: no help"
    if parser.prog != "kimi-batch":
        assert parser.description, f"{parser.prog}: no description"


def test_kimi_batch_help_speaks_to_users_and_warns_of_nothing(tmp_path: Path) -> None:
    # 64 threads on this machine would be clamped: a server start would warn, --help must not.
    result = run_cli(tmp_path, "--help", KIMI_BATCH_LLAMA_THREADS="64")

    assert result.returncode == 0, result.stderr
    assert "run the whole pipeline once" in result.stdout
    assert not INTERNAL.search(result.stdout), INTERNAL.search(result.stdout)
    assert THREAD_WARNING not in result.stdout + result.stderr
    assert result.stderr == ""


def test_status_prints_no_thread_warning(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "status", KIMI_BATCH_LLAMA_THREADS="64")

    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("server")
    assert THREAD_WARNING not in result.stdout + result.stderr
    assert not INTERNAL.search(result.stdout + result.stderr)


def test_status_of_a_running_server_prints_no_thread_warning(tmp_path: Path) -> None:
    """`status` reads the running server's thread count; the clamp was said when it started."""
    server_dir = tmp_path / "home" / "server"
    server_dir.mkdir(parents=True)
    port = free_port()  # nothing answers there: the process below stands in for the server
    spec = ServerSpec(
        binary=Path("/bin/sleep"),
        model=Path("/models/model.gguf"),
        port=port,
        threads=64,
        slot_save_path=tmp_path / "home" / "slots",
    )
    with subprocess.Popen(["sleep", "300"]) as stand_in:
        try:
            ticks = process_start_ticks(stand_in.pid)
            assert ticks is not None
            record = {"pid": stand_in.pid, "start_ticks": ticks, "started_at": time.time()}
            (server_dir / "server.pid").write_text(json.dumps(record))
            (server_dir / "server.spec.json").write_text(spec.model_dump_json())

            result = run_cli(
                tmp_path,
                "status",
                "--json",
                KIMI_BATCH_LLAMA_THREADS="64",
                KIMI_BATCH_LLAMA_PORT=str(port),
            )
        finally:
            stand_in.kill()

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["server"]["pid"] == stand_in.pid
    assert THREAD_WARNING not in result.stdout + result.stderr


@pytest.mark.slow
def test_starting_a_server_warns_of_the_clamp_once(tmp_path: Path) -> None:
    """The command that starts the server is the one the thread clamp concerns."""
    env = {"KIMI_BATCH_LLAMA_THREADS": "64", "KIMI_BATCH_LLAMA_PORT": str(free_port())}
    try:
        started = run_cli(tmp_path, "server", "start", **env)
        assert started.returncode == 0, started.stderr
        assert (started.stdout + started.stderr).count(THREAD_WARNING) == 1
        again = run_cli(tmp_path, "server", "start", **env)  # attaches: nothing is started
        assert again.returncode == 0, again.stderr
        assert THREAD_WARNING not in again.stdout + again.stderr
    finally:
        run_cli(tmp_path, "server", "stop", **env)
