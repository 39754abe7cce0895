"""The Batch API's generated key: made once at the first start, kept owner-only, reused after.

Like Jupyter's token: with `KIMI_BATCH_API_KEY` unset, `kimi-batch api` still needs a key, so it
writes a random one to `StatePaths.api_key_path` (0600 in a 0700 folder) and prints where it is.
The file is written under a temp name and linked into place, so a second server starting at the
same moment reads the first one's key and never a half-written file.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from kimi_batch.errors import ConfigError
from kimi_batch.paths import PRIVATE_FILE_MODE, private_dir

# 32 random bytes: the strength of an OpenAI key, URL- and shell-safe.
_KEY_BYTES = 32


def load_or_create_key(path: Path) -> tuple[str, bool]:
    """The key stored at `path` and whether this call created it."""
    private_dir(path.parent)
    try:
        return _read_key(path), False
    except FileNotFoundError:
        pass
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    descriptor = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE_MODE)
    try:
        with os.fdopen(descriptor, "w") as writer:
            writer.write(secrets.token_urlsafe(_KEY_BYTES) + "\n")
        try:
            os.link(temp, path)
        except FileExistsError:
            return _read_key(path), False
    finally:
        temp.unlink(missing_ok=True)
    return _read_key(path), True


def _read_key(path: Path) -> str:
    mode = path.stat().st_mode
    # A key others can read protects nothing: refuse it rather than serve with it.
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"{path} is readable by other users (mode {stat.S_IMODE(mode):o}): "
            f"run `chmod 600 {path}` or delete it to have a new key made"
        )
    key = path.read_text(encoding="utf-8").strip()
    if not key:
        raise ConfigError(f"{path} is empty: delete it to have a new key made")
    return key
