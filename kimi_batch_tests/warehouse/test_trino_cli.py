"""The Trino catalog file (`kimi-batch publish`, `scripts/trino.sh config`), how the script tells
a started Trino from a dead one, and `make trino-cli`."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kimi_batch.settings import Settings
from kimi_batch.warehouse import CATALOG_NAME, LEDGER_SCHEMA, TrinoReader, catalog_properties
from kimi_batch_tests.support.cli import CLI_TIMEOUT_S, run_cli
from kimi_batch_tests.support.java_properties import read_like_java
from kimi_batch_tests.support.ports import free_port
from kimi_batch_tests.support.processes import kernel_thread, process_state, processes_naming
from kimi_batch_tests.support.repo import REPO_ROOT
from kimi_batch_tests.support.rows import amplified, distilled
from kimi_batch_tests.support.script_server import run_script
from kimi_batch_tests.support.trino import SCRIPT as TRINO_SCRIPT
from kimi_batch_tests.support.trino import TrinoServer

# Its slow tests start no llama-server: they run beside the ones that do (support/slow_split.py).
pytestmark = pytest.mark.no_llama_server

PG_URL = "postgresql://kimi%40ops:p%40ss%5Cw0rd@db.example:6543/kb?sslmode=require"
S3 = {
    "KIMI_BATCH_WAREHOUSE": "s3://kimi-batch/nightly",
    "KIMI_BATCH_S3_ENDPOINT": "http://127.0.0.1:9000",
    "AWS_ACCESS_KEY_ID": "box-key",
    "AWS_SECRET_ACCESS_KEY": "box-secret",
}


def _properties(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines())


def test_the_folder_warehouse_catalog_is_the_ledger_file(tmp_path: Path) -> None:
    written = run_script(
        TRINO_SCRIPT, "config", {**_base_env(), "KIMI_BATCH_HOME": str(tmp_path)}, CLI_TIMEOUT_S
    )
    assert written.returncode == 0, written.stderr
    catalog = tmp_path / "trino" / "etc" / "catalog" / "iceberg.properties"
    assert _properties(catalog) == {
        "connector.name": "iceberg",
        "iceberg.catalog.type": "jdbc",
        "iceberg.jdbc-catalog.catalog-name": CATALOG_NAME,
        "iceberg.jdbc-catalog.driver-class": "org.sqlite.JDBC",
        "iceberg.jdbc-catalog.connection-url": f"jdbc:sqlite:{tmp_path}/ledger/ledger.sqlite3",
        "iceberg.jdbc-catalog.default-warehouse-dir": f"file://{tmp_path}/warehouse",
        "iceberg.security": "read_only",
        "fs.native-local.enabled": "true",
        "local.location": "/",
    }
    assert stat.S_IMODE(catalog.stat().st_mode) == 0o600


def test_a_postgres_and_s3_catalog_holds_its_secrets_in_a_private_file(tmp_path: Path) -> None:
    env = {**_base_env(), **S3, "KIMI_BATCH_HOME": str(tmp_path), "KIMI_BATCH_DATABASE_URL": PG_URL}
    written = run_script(TRINO_SCRIPT, "config", env, CLI_TIMEOUT_S)
    assert written.returncode == 0, written.stderr
    catalog = tmp_path / "trino" / "etc" / "catalog" / "iceberg.properties"
    properties = _properties(catalog)
    assert properties["iceberg.jdbc-catalog.driver-class"] == "org.postgresql.Driver"
    assert properties["iceberg.jdbc-catalog.connection-url"] == (
        f"jdbc:postgresql://db.example:6543/kb?sslmode=require&currentSchema={LEDGER_SCHEMA}"
    )
    assert properties["iceberg.jdbc-catalog.connection-user"] == "kimi@ops"
    # Java properties read `\\` back as one backslash: the password as the URL decodes it.
    assert properties["iceberg.jdbc-catalog.connection-password"] == "p@ss\\\\w0rd"
    assert properties["iceberg.jdbc-catalog.default-warehouse-dir"] == "s3://kimi-batch/nightly"
    assert {
        "fs.native-s3.enabled": "true",
        "s3.endpoint": "http://127.0.0.1:9000",
        "s3.path-style-access": "true",
        "s3.region": "us-east-1",
        "s3.aws-access-key": "box-key",
        "s3.aws-secret-key": "box-secret",
    }.items() <= properties.items()
    assert "fs.native-local.enabled" not in properties
    assert stat.S_IMODE(catalog.stat().st_mode) == 0o600
    assert "box-secret" not in written.stderr + written.stdout


def test_a_home_past_ascii_or_with_a_backslash_reaches_trino_as_it_is_named(tmp_path: Path) -> None:
    """node.properties took $KIMI_BATCH_HOME raw; Trino's launcher and Java read a properties
    file as ISO-8859-1 with backslash escapes, so `ü` came back as `Ã¼` and `\\x` as `x`."""
    home = tmp_path / "kimi hüme\\x"
    written = run_script(
        TRINO_SCRIPT, "config", {**_base_env(), "KIMI_BATCH_HOME": str(home)}, CLI_TIMEOUT_S
    )
    assert written.returncode == 0, written.stderr
    etc = home / "trino" / "etc"
    node = read_like_java((etc / "node.properties").read_bytes())
    assert node["node.data-dir"] == str(home / "trino" / "data")
    catalog = read_like_java((etc / "catalog" / "iceberg.properties").read_bytes())
    assert catalog["iceberg.jdbc-catalog.connection-url"] == (
        f"jdbc:sqlite:{home}/ledger/ledger.sqlite3"
    )
    # Every file Java or the launcher reads as properties is ASCII: nothing for Latin-1 to mangle.
    for name in ("node.properties", "config.properties", "log.properties"):
        assert (etc / name).read_bytes().isascii(), name


def test_a_catalog_management_other_than_static_or_dynamic_is_refused(tmp_path: Path) -> None:
    # It went into config.properties raw: a line break in it wrote a property of its own.
    env = {
        **_base_env(),
        "KIMI_BATCH_HOME": str(tmp_path),
        "KIMI_BATCH_TRINO_CATALOG_MANAGEMENT": "dynamic\nhttp-server.http.port=1",
    }
    written = run_script(TRINO_SCRIPT, "config", env, CLI_TIMEOUT_S)
    assert written.returncode != 0
    assert "KIMI_BATCH_TRINO_CATALOG_MANAGEMENT must be static or dynamic" in written.stderr
    assert not (tmp_path / "trino" / "etc" / "config.properties").exists()


def test_publish_prints_the_catalog_with_its_secrets_masked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {**S3, "KIMI_BATCH_DATABASE_URL": PG_URL}
    printed = run_cli(tmp_path, "publish", **env)
    assert printed.returncode == 0, printed.stderr
    assert "box-secret" not in printed.stdout
    assert "p@ss" not in printed.stdout
    for name, value in {**env, "KIMI_BATCH_HOME": str(tmp_path / "home")}.items():
        monkeypatch.setenv(name, value)
    expected = catalog_properties(Settings.from_env(), masked=True)
    assert printed.stdout == expected
    assert "iceberg.jdbc-catalog.connection-password=***" in expected.splitlines()


def _base_env() -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("KIMI_BATCH_", "AWS_"))}
    return {**clean, "PYTHONPATH": str(REPO_ROOT)}


def _script_env(home: Path, **extra: str) -> dict[str, str]:
    return {
        **_base_env(),
        "KIMI_BATCH_HOME": str(home),
        "KIMI_BATCH_TRINO_PORT": str(free_port()),
        **extra,
    }


def _pid_file(home: Path, pid: int) -> None:
    (home / "trino").mkdir(parents=True)
    (home / "trino" / "trino.pid").write_text(f"{pid}\n")


def test_wait_counts_the_started_process_alive_whatever_its_command_line_reads(
    tmp_path: Path,
) -> None:
    """While the launcher execs the JVM its command line reads empty: `wait` took that for a
    death and a test's fixture stopped a healthy Trino (CI, under load). Here the pid names a
    process that is no Trino at all: `wait` waits for it, to its timeout."""
    with subprocess.Popen(["sleep", "60"]) as starting:
        try:
            _pid_file(tmp_path, starting.pid)
            env = _script_env(tmp_path, KIMI_BATCH_TRINO_TIMEOUT="3")
            waited = run_script(TRINO_SCRIPT, "wait", env, CLI_TIMEOUT_S)
        finally:
            starting.kill()
    assert waited.returncode != 0
    assert "did not become ready within 3s" in waited.stderr
    assert "died" not in waited.stderr


def test_wait_and_status_see_a_started_process_that_is_gone(tmp_path: Path) -> None:
    with subprocess.Popen(["true"]) as gone:
        gone.wait()
    _pid_file(tmp_path, gone.pid)
    env = _script_env(tmp_path)
    waited = run_script(TRINO_SCRIPT, "wait", env, CLI_TIMEOUT_S)
    assert waited.returncode != 0
    assert "the Trino process died during startup" in waited.stderr
    with subprocess.Popen(["true"]) as zombie:  # exited, not reaped yet: no process either
        zombie_pid = zombie.pid
        while process_state(zombie_pid) != "Z":
            time.sleep(0.01)
        (tmp_path / "trino" / "trino.pid").write_text(f"{zombie_pid}\n")
        status = run_script(TRINO_SCRIPT, "status", env, CLI_TIMEOUT_S)
    assert status.returncode == 3, status.stderr
    assert "not running" in status.stdout + status.stderr


def test_status_and_stop_take_a_pid_file_naming_a_kernel_thread_for_no_trino(
    tmp_path: Path,
) -> None:
    """A pid file from before a reboot may name a kernel thread by now: its command line reads
    empty for good, where a starting JVM's reads empty for milliseconds. Neither command waits
    on it for long or signals it."""
    _pid_file(tmp_path, kernel_thread())
    env = _script_env(tmp_path)
    status = run_script(TRINO_SCRIPT, "status", env, CLI_TIMEOUT_S)
    assert status.returncode == 3, status.stderr
    assert "not running" in status.stdout + status.stderr
    stopped = run_script(TRINO_SCRIPT, "stop", env, CLI_TIMEOUT_S)
    assert stopped.returncode == 0, stopped.stderr
    assert not (tmp_path / "trino" / "trino.pid").exists()


# A Java 25 to `java -version`; else a server that runs until it is stopped.
_STAND_IN_JAVA = """#!/bin/bash
if [[ " $* " == *" -version "* ]]; then echo 'openjdk version "25.0.1" 2025-10-21' >&2; exit 0; fi
trap 'exit 0' TERM
while :; do sleep 0.1; done
"""


def _servers_of(home: Path, timeout_s: float = 60.0) -> tuple[int, list[int]]:
    """The pid the pid file names, and the live processes running the server's main class over
    `home`, once the pid file's does (the launcher execs it) or at the timeout."""
    pid = int((home / "trino" / "trino.pid").read_text())
    deadline = time.monotonic() + timeout_s
    while True:
        servers = [
            found
            for found, cmdline in processes_naming(home).items()
            if "io.trino.server.TrinoServer" in cmdline
        ]
        if pid in servers or time.monotonic() > deadline:
            return pid, servers
        time.sleep(0.2)


@pytest.mark.slow
def test_starts_on_a_busy_core_leave_the_pid_file_naming_the_server(tmp_path: Path) -> None:
    """`launcher start` forked its daemon with no stdout and raced it over the pid file: on a
    loaded machine a start could leave the pid file naming a gone process while the JVM ran
    under another pid (`wait` saw a death, `stop` left the JVM running) or no JVM at all,
    silently (CI: a whole tier failed). Twelve starts at once on one core that three busy loops
    share (where `launcher start` lost the race in each of three runs): every pid file names its
    running server, and `stop` ends each."""
    java_home = tmp_path / "jdk"
    (java_home / "bin").mkdir(parents=True)
    (java_home / "bin" / "java").write_text(_STAND_IN_JAVA)
    (java_home / "bin" / "java").chmod(0o755)
    homes = [tmp_path / f"home_{index:02d}" for index in range(12)]
    envs = [_script_env(home, JAVA_HOME=str(java_home)) for home in homes]
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cpus)})  # the children (threads, processes) inherit it
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(3)]
    try:
        with ThreadPoolExecutor(len(envs)) as pool:
            started = list(
                pool.map(lambda env: run_script(TRINO_SCRIPT, "start", env, CLI_TIMEOUT_S), envs)
            )
    finally:
        for process in busy:
            process.kill()
            process.wait()
        os.sched_setaffinity(0, cpus)
    try:
        for home, result in zip(homes, started, strict=True):
            assert result.returncode == 0, result.stderr
            pid, servers = _servers_of(home)
            assert servers == [pid], (home.name, result.stdout)
    finally:
        stopped = [run_script(TRINO_SCRIPT, "stop", env, CLI_TIMEOUT_S) for env in envs]
    assert all(result.returncode == 0 for result in stopped), [r.stderr for r in stopped]
    assert processes_naming(tmp_path) == {}


@pytest.mark.slow
def test_make_trino_cli_queries_the_schema_without_qualifying_names(
    trino_server: TrinoServer,
) -> None:
    warehouse, config = trino_server.isolated("t_trino_cli")
    rows = distilled(amplified(3))
    warehouse.write_partition("distilled", "2024-05-02", "cli", rows)
    with TrinoReader(config) as reader:
        assert reader.count("distilled") == len(rows)  # no publish step: the commit is visible

    env = {
        **os.environ,
        "KIMI_BATCH_TRINO_PORT": str(trino_server.port),
        "KIMI_BATCH_TRINO_SCHEMA": "t_trino_cli",
    }
    result = subprocess.run(
        [
            "make",
            "-s",
            "trino-cli",
            "TRINO_CLI_ARGS=--output-format CSV_UNQUOTED --execute "
            '"SELECT current_catalog, current_schema; SELECT count(*) FROM distilled"',
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    expected = ["iceberg,t_trino_cli", str(len(rows))]
    assert result.stdout.strip().splitlines() == expected, result.stdout
