"""How a server process ended, in one line: signals are named, the CPU hint only when it fits."""

from __future__ import annotations

import signal
from pathlib import Path

from kimi_batch.llama.exits import (
    CPU_FEATURE_HINT,
    DURING_LOAD,
    describe_exit,
    read_exit_record,
    signal_name,
)

LOG = Path("/state/server/server.log")


def test_a_segfault_during_the_load_names_the_signal_the_log_and_the_cpu_hint() -> None:
    line = describe_exit(-signal.SIGSEGV, what="llama-server (pid 7)", log_path=LOG)
    assert line.startswith(f"llama-server (pid 7) was killed by SIGSEGV {DURING_LOAD}")
    assert str(LOG) in line
    assert CPU_FEATURE_HINT in line
    assert "KIMI_BATCH_LLAMA_AMX=1" in line
    assert "KIMI_BATCH_LLAMA_SERVER" in line
    assert "\n" not in line


def test_sigill_within_the_first_seconds_of_serving_keeps_the_hint() -> None:
    line = describe_exit(-signal.SIGILL, what="llama-server", log_path=LOG, serving_s=3.0)
    assert "killed by SIGILL after 3 s of serving" in line
    assert CPU_FEATURE_HINT in line


def test_a_late_segfault_or_another_signal_has_no_cpu_hint() -> None:
    late = describe_exit(-signal.SIGSEGV, what="llama-server", log_path=LOG, serving_s=7200.0)
    assert "killed by SIGSEGV after 2.0 h of serving" in late
    assert CPU_FEATURE_HINT not in late
    oom = describe_exit(-signal.SIGKILL, what="llama-server", log_path=LOG)
    assert f"killed by SIGKILL {DURING_LOAD}" in oom
    assert CPU_FEATURE_HINT not in oom


def test_an_ordinary_exit_says_its_code_not_a_signal() -> None:
    line = describe_exit(1, what="llama-server", log_path=None)
    assert line == f"llama-server exited with code 1 {DURING_LOAD}"
    assert signal_name(1) is None
    assert signal_name(-11) == "SIGSEGV"


def test_a_record_of_another_pid_is_not_this_servers(tmp_path: Path) -> None:
    path = tmp_path / "server.exit.json"
    path.write_text('{"pid": 41, "returncode": -11, "started_at": 1.0, "ended_at": 2.0}')
    assert read_exit_record(path, 42) is None
    record = read_exit_record(path, 41)
    assert record is not None
    assert record.returncode == -11
    path.write_text("{half a record")
    assert read_exit_record(path, 41) is None
