"""llama-server's command-line flags as its parser reads them (llama.cpp's `common/arg.cpp`,
checked against the bundled binary): a short or a long name, `_` read as `-` in a long name
(`--ctx_size` is `--ctx-size`), the value the next argument, and a later occurrence overriding
an earlier one. `--name=value` is not a flag to it: the server refuses to start ("invalid
argument"), so it gives no value here. The extra arguments (`KIMI_BATCH_LLAMA_EXTRA_ARGS`) come
last on the command line, so a flag they repeat is the one the server uses: the memory check
and the slot count read it.
"""

from __future__ import annotations

from collections.abc import Sequence


def _spelling(arg: str) -> str:
    return arg.replace("_", "-") if arg.startswith("--") else arg


def flag_value(args: Sequence[str], names: tuple[str, ...]) -> str | None:
    """The value llama-server takes for the flag `names` spell: its last occurrence's (the
    first was read once, so a flag repeated in the extra arguments was estimated with the
    value the server ignores)."""
    found: str | None = None
    for index, arg in enumerate(args):
        if _spelling(arg) in names and index + 1 < len(args):
            found = args[index + 1]
    return found


def count_flag(args: Sequence[str], names: tuple[str, ...], default: int, least: int) -> int:
    """The whole number >= `least` that `args` give the flag, else `default` (absent, or a
    value such as `-1` for "auto" whose count is not known here)."""
    value = flag_value(args, names)
    if value is None or not (value.isascii() and value.isdigit()) or int(value) < least:
        return default
    return int(value)


def last_switch(args: Sequence[str], on: tuple[str, ...], off: tuple[str, ...]) -> bool:
    """Whether the last of a switch's on and off names in `args` is an on one (False when
    neither is given)."""
    switches = [_spelling(arg) in on for arg in args if _spelling(arg) in on + off]
    return bool(switches) and switches[-1]
