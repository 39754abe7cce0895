"""The entry points: the `kimi-batch` command (`main`) and what its subcommands run.

`main` (in `commands`; the console script `kimi_batch.cli:main`, also `python -m kimi_batch.cli`)
parses the command line and reads the environment once; `demo`, `export`, `publish` and `status` (with its
document, `status_sections`) are the commands that need more than a line, and `progress_bar` is
the terminal bar of the in-process runs. `kimi-batch bench`, `tune` and `plan` live in
the bench package beside this one, which `bench_hook` finds when it is installed.
"""

from kimi_batch.cli.commands import main

__all__ = ["main"]
