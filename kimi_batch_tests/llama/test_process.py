"""The server's process by pid and start time: a signal never reaches a later process the kernel
gave the server's pid; its probe tells a refused key from a healthy server (server-free:
stand-ins)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kimi_batch.llama import process as process_module
from kimi_batch.llama import server as server_module
from kimi_batch.llama.exceptions import LlamaRequestError
from kimi_batch.llama.process import (
    PidRecord,
    probe,
    process_start_ticks,
    running,
    signal_process,
)
from kimi_batch.llama.server import ResidentServer
from kimi_batch.llama.spec import ServerSpec

# Exits half a second after SIGTERM, as llama-server finishes its shutdown.
_SERVER = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: (time.sleep(0.5), sys.exit(0)))\n"
    "print('ready', flush=True)\n"
    "while True: time.sleep(1)\n"
)


def _stand_in() -> tuple[subprocess.Popen[str], PidRecord]:
    child = subprocess.Popen([sys.executable, "-c", _SERVER], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    assert child.stdout.readline() == "ready\n"
    ticks = process_start_ticks(child.pid)
    assert ticks is not None
    return child, PidRecord(pid=child.pid, start_ticks=ticks, started_at=time.time())


def test_a_record_of_another_start_time_is_never_signalled() -> None:
    child, record = _stand_in()
    try:
        later = record.model_copy(update={"start_ticks": record.start_ticks + 1})
        assert not running(later)
        assert not signal_process(later, signal.SIGKILL)
        assert child.poll() is None  # untouched
        assert signal_process(record, signal.SIGKILL)
        assert child.wait(10) == -signal.SIGKILL
        assert not signal_process(record, signal.SIGKILL)  # gone: no error, nothing sent
    finally:
        child.kill()
        child.wait()


def test_stop_never_signals_a_later_process_given_the_server_s_pid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by review: after SIGTERM, stop() waited while *some* process had the pid and
    SIGKILLed it at the end, the waiter having reaped the server at once: a later process given
    that pid was killed. Here the pid shows another start time once the server has exited."""
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x")
    spec = ServerSpec(binary=Path("/bin/true"), model=model, port=1, slot_save_path=tmp_path)
    server = ResidentServer(spec, tmp_path / "state")
    (tmp_path / "state").mkdir()
    child, record = _stand_in()
    server.pid_path.write_text(record.model_dump_json())
    real = process_start_ticks

    def reused(pid: int) -> int | None:
        ticks = real(pid)
        if pid == record.pid and (ticks is None or child.poll() is not None):
            return record.start_ticks + 1  # the server is gone: a later process has its pid
        return ticks

    sent: list[int] = []
    kill, pidfd_send = os.kill, signal.pidfd_send_signal

    def kill_recorded(pid: int, sig: int) -> None:
        if pid == record.pid:
            sent.append(sig)
        kill(pid, sig)

    def pidfd_recorded(fd: int, sig: int, *args: object) -> None:
        sent.append(sig)
        pidfd_send(fd, sig)

    monkeypatch.setattr(process_module, "process_start_ticks", reused)
    monkeypatch.setattr(server_module, "process_start_ticks", reused)
    monkeypatch.setattr(os, "kill", kill_recorded)
    monkeypatch.setattr(signal, "pidfd_send_signal", pidfd_recorded)
    started = time.monotonic()
    try:
        assert server.stop()
    finally:
        child.kill()
        child.wait()
    assert sent == [signal.SIGTERM]  # and no SIGKILL for the pid's later process
    assert time.monotonic() - started < 10  # not the 20 s grace: it saw the server go
    assert not server.pid_path.exists()


class _KeyedServer(BaseHTTPRequestHandler):
    """llama-server's answers with an API key: /health public, /props for the key only."""

    def do_GET(self) -> None:
        if self.path == "/health":
            self._answer(200, {"status": "ok"})
        elif self.headers.get("Authorization") == "Bearer right-key":
            self._answer(200, {"model_path": "/m/other-model.gguf", "total_slots": 8})
        else:
            self._answer(401, {"error": {"code": 401, "message": "Invalid API Key"}})

    def _answer(self, status: int, body: dict[str, object]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_a_server_that_refuses_our_key_is_an_error_not_a_healthy_one_slot_server() -> None:
    """Found by review: probe read any /props answer as the server's props (every field has a
    default), so a 401 made a healthy server of one slot and model ''."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _KeyedServer)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        state, props = probe(url, "right-key")
        assert state == "ok"
        assert props is not None
        assert props.total_slots == 8
        with pytest.raises(LlamaRequestError, match="KIMI_BATCH_LLAMA_API_KEY"):
            probe(url, "wrong-key")
        with pytest.raises(LlamaRequestError, match="KIMI_BATCH_LLAMA_API_KEY"):
            probe(url, None)
    finally:
        httpd.shutdown()
        httpd.server_close()


class _EndlessServer(BaseHTTPRequestHandler):
    """A server whose /health answers 200 and never ends its body."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        with contextlib.suppress(OSError):
            while True:
                self.wfile.write(b" " * 65536)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_a_probe_of_a_body_without_end_is_down_not_a_process_out_of_memory() -> None:
    """Found by review: the probe read /health and /props whole, however long."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _EndlessServer)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        started = time.monotonic()
        assert probe(f"http://127.0.0.1:{httpd.server_address[1]}", None) == ("down", None)
        assert time.monotonic() - started < 30
    finally:
        httpd.shutdown()
        httpd.server_close()
