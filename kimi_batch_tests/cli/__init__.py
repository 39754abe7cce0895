"""Tests of kimi_batch.cli (the `kimi-batch` command and its subcommands)."""
