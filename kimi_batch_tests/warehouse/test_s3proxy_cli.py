"""`scripts/s3proxy.sh` without a server: the properties file it hands s3proxy (`config` writes it
as `start` does, with nothing started), each value as Java's `Properties.load` reads it back; and
a pid file naming another process."""

from __future__ import annotations

import os
import stat
import subprocess
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


def test_a_pid_file_naming_another_process_is_not_taken_for_the_server(tmp_path: Path) -> None:
    """A pid file left by a server that died (or from before a reboot) may name an unrelated
    process by now: `status` called it running and `stop` killed it."""
    home = tmp_path / "home"
    state = home / "s3proxy"
    state.mkdir(parents=True)
    env = {**os.environ, "KIMI_BATCH_HOME": str(home)}
    with subprocess.Popen(["sleep", "300"]) as other:
        try:
            (state / "s3proxy.pid").write_text(f"{other.pid}\n")
            status = run_script(S3PROXY_SCRIPT, "status", env, TIMEOUT_S)
            assert status.returncode == 3, status.stdout
            stopped = run_script(S3PROXY_SCRIPT, "stop", env, TIMEOUT_S)
            assert stopped.returncode == 0, stopped.stderr
            assert other.poll() is None, "stop signalled a process that is not s3proxy"
            assert not (state / "s3proxy.pid").exists()  # the stale file is gone
        finally:
            other.kill()
