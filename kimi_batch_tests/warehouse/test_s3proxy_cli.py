"""The properties file `scripts/s3proxy.sh` hands s3proxy (`config` writes it as `start` does,
with nothing started): each value as Java's `Properties.load` reads it back."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from kimi_batch_tests.support.java_properties import read_like_java
from kimi_batch_tests.support.ports import free_port
from kimi_batch_tests.support.s3proxy import SCRIPT as S3PROXY_SCRIPT
from kimi_batch_tests.support.script_server import run_script

TIMEOUT_S = 60


def test_a_home_past_ascii_or_with_a_backslash_reaches_s3proxy_as_it_is_named(
    tmp_path: Path,
) -> None:
    """The file took $KIMI_BATCH_HOME raw, and s3proxy reads it as ISO-8859-1 with backslash
    escapes: `ü` came back as `Ã¼`, `\\x` as `x`, and the store was another folder."""
    home = tmp_path / "kimi hüme\\x"
    port = free_port()
    env = {**os.environ, "KIMI_BATCH_HOME": str(home), "KIMI_BATCH_S3PROXY_PORT": str(port)}
    written = run_script(S3PROXY_SCRIPT, "config", env, TIMEOUT_S)
    assert written.returncode == 0, written.stderr
    state = home / "s3proxy"
    conf = state / "s3proxy.conf"
    assert conf.read_bytes().isascii()
    properties = read_like_java(conf.read_bytes())
    assert properties["jclouds.filesystem.basedir"] == str(state / "data")
    assert properties["s3proxy.endpoint"] == f"http://127.0.0.1:{port}"
    assert properties["s3proxy.credential"] == (state / "secret").read_text().strip()
    assert (state / "data" / "kimi-batch").is_dir()
    assert stat.S_IMODE(conf.stat().st_mode) == 0o600
    assert not (state / "s3proxy.pid").exists()  # nothing started
