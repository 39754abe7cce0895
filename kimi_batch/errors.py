"""The root of every error kimi_batch raises on purpose: `KimiBatchError`.

An expected failure (bad configuration, a missing model or input, a digest that would break the
prefix cache, an unreachable server or Trino) is a `KimiBatchError`; the CLI prints it as one line
and exits 2. Anything else is a bug and keeps its traceback. This module sits below every layer
and imports nothing of the package, so each layer derives its own errors from it:

KimiBatchError
├── ConfigError            a KIMI_BATCH_* variable or option has an unusable value (a ValueError)
├── MissingInputError      an input file or partition a command needs does not exist
│                          (a FileNotFoundError)
├── llama.exceptions.LlamaError        llama-server client and resident-server manager
├── engine.digest.DigestLintError      cache-breaking dynamic content in the system digest
└── storage.exceptions.StorageError    Parquet warehouse and Trino
"""

from __future__ import annotations


class KimiBatchError(Exception):
    """Base of every expected kimi_batch failure: its message is what the user reads."""


class ConfigError(KimiBatchError, ValueError):
    """A setting (environment variable, resource config, CLI option) that cannot be used."""


class MissingInputError(KimiBatchError, FileNotFoundError):
    """An input file, partition or model a command needs is not there."""
