"""The bench: `kimi-batch bench` (contenders side by side), `tune` (threads/slots), `plan` (a
night), the time-scaled stand-in of the target and its rehearsal.

A sibling of the runtime package, installed with it; the `bench` extra brings what only the bench
uses (matplotlib's charts, rensa). It uses the runtime (down to its Dagster definitions, since
contender D materializes a partition) and the runtime never imports it: the `kimi-batch` command
finds it by name, once, to add these subcommands (`add_perf_commands`).
"""

from kimi_batch_bench.commands import add_perf_commands

__all__ = ["add_perf_commands"]
