"""Where `kimi-batch bench`, `tune` and `plan` come from: the bench package beside this one.

The bench (`kimi_batch_bench`, the `bench` extra) imports the runtime; the runtime names it here
only, by a string, when the parser is built (`kimi_batch_tests/test_bench_boundary.py`). Without
it these commands still answer, with the extra to install, instead of "invalid choice".
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any

from kimi_batch.errors import ConfigError
from kimi_batch.settings import Settings

BENCH_PACKAGE = "kimi_batch_bench"
# The commands the bench adds: only named for the message when it is not installed.
BENCH_COMMANDS = ("bench", "tune", "plan")


def _bench_missing(args: argparse.Namespace, settings: Settings | None) -> int:
    raise ConfigError(
        f"'kimi-batch {args.command}' is part of the bench: install the bench extra "
        "(pip install 'kimi_batch[bench]')"
    )


def add_bench_commands(commands: argparse._SubParsersAction[Any], *, json_help: str) -> None:
    """The bench's commands on the `kimi-batch` parser's subcommands, or their stand-ins."""
    try:
        bench = importlib.import_module(BENCH_PACKAGE)
    except ModuleNotFoundError as error:
        if error.name != BENCH_PACKAGE:
            raise  # the bench is there but broken: its own traceback says why
        for name in BENCH_COMMANDS:  # no help=: left out of the command list
            # Every word after the command is an operand (no prefix char), so its options, -h
            # included, reach the message instead of "unrecognized arguments".
            command = commands.add_parser(name, add_help=False, prefix_chars="\0")
            command.add_argument("words", nargs="*")
            command.set_defaults(func=_bench_missing, needs_settings=False)
        return
    bench.add_perf_commands(commands, json_help=json_help)
