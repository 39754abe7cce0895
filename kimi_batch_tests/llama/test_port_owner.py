"""Whose server answers on the port: a start never takes another process's answer for the server
it spawned (server-free: a stand-in llama-server script and loopback HTTP servers).

Found by review: the manager probed the port once before its spawn, and its wait for health then
trusted any healthy answer on the port. A server that took the port between the two (another
state dir's start, racing), or one sharing it through SO_REUSEPORT (llama.cpp's cpp-httplib set
it on Linux, so a second llama-server on the same port bound without error and the kernel split
the connections between them), made the start succeed on the other process's answer: the pid it
recorded was a child that died on the taken port, or one serving beside a stranger.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest

from kimi_batch.llama import server as server_module
from kimi_batch.llama.exceptions import ServerSpawnError, SpecMismatchError
from kimi_batch.llama.process import running
from kimi_batch.llama.server import ResidentServer
from kimi_batch.llama.spec import ServerSpec
from kimi_batch_tests.support.ports import free_port

SLOTS = 2

# A llama-server stand-in: binds --host/--port (after STANDIN_BIND_DELAY_S, as a real one
# initialises its backends first; with SO_REUSEPORT when STANDIN_REUSE_PORT=1), answers /health
# and /props with its --model and --parallel, and exits 1 on a taken port as llama-server does.
_STANDIN = """\
import json, os, socket, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
time.sleep(float(os.environ.get("STANDIN_BIND_DELAY_S", "0")))
props = {"model_path": args["--model"], "total_slots": int(args["--parallel"])}

class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"status": "ok"} if self.path == "/health" else props).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass

class Server(ThreadingHTTPServer):
    allow_reuse_port = os.environ.get("STANDIN_REUSE_PORT") == "1"

try:
    httpd = Server((args["--host"], int(args["--port"])), Handler)
except OSError:
    print(f"couldn't bind HTTP server socket, hostname: {args['--host']}, port: {args['--port']}",
          flush=True)
    sys.exit(1)
print("server is listening", flush=True)
httpd.serve_forever()
"""


def _standin(folder: Path) -> Path:
    path = folder / "llama-server-standin"
    path.write_text(f"#!{sys.executable}\n{_STANDIN}")
    path.chmod(0o755)
    return path


def _manager(tmp_path: Path, port: int, *extra_args: str) -> ResidentServer:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    spec = ServerSpec(
        binary=_standin(tmp_path),
        model=model,
        port=port,
        parallel=SLOTS,
        cache_ram_mib=None,
        metrics=False,
        slot_save_path=tmp_path / "slots",
        extra_args=extra_args,
    )
    return ResidentServer(spec, tmp_path / "state", load_timeout_s=20)


@pytest.fixture(autouse=True)
def _no_gguf_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stand-in's model is no GGUF: the memory check (its own tests) is left out."""
    monkeypatch.setattr(
        server_module, "check_memory", lambda *a, **k: SimpleNamespace(describe=lambda: "-")
    )


def _handler(model: str, *, down_first: bool, slots: int = SLOTS) -> type[BaseHTTPRequestHandler]:
    """A llama-server of `model` and `slots` that, with `down_first`, answers nothing readable
    to the first probe (it started after it: a racing start of another state dir)."""
    seen = {"health": 0}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/health":
                seen["health"] += 1
                if down_first and seen["health"] == 1:
                    self._answer(404, {})
                    return
                self._answer(200, {"status": "ok"})
            else:
                self._answer(200, {"model_path": model, "total_slots": slots})

        def _answer(self, status: int, body: dict[str, object]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


@contextlib.contextmanager
def _other_server(
    port: int, handler: type[BaseHTTPRequestHandler], *, reuse_port: bool = False
) -> Iterator[None]:
    class Server(ThreadingHTTPServer):
        allow_reuse_port = reuse_port

    httpd = Server(("127.0.0.1", port), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield
    finally:
        httpd.shutdown()
        httpd.server_close()


def _assert_nothing_recorded(manager: ResidentServer) -> None:
    assert not manager.pid_path.exists()
    assert not manager.spec_path.exists()


def _stop_left_over(manager: ResidentServer) -> None:
    with contextlib.suppress(Exception):
        manager.stop()


def test_a_port_taken_by_an_unrelated_service_fails_the_start_in_one_line_before_any_spawn(
    tmp_path: Path,
) -> None:
    port = free_port()
    manager = _manager(tmp_path, port)

    class Unrelated(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"OK")

        def log_message(self, format: str, *args: object) -> None:
            pass

    try:
        with _other_server(port, Unrelated), pytest.raises(ServerSpawnError) as raised:
            manager.ensure_running()
    finally:
        _stop_left_over(manager)
    message = str(raised.value)
    assert "\n" not in message
    assert f"port {port}" in message
    assert "KIMI_BATCH_LLAMA_PORT" in message
    log = manager.log_path.read_text() if manager.log_path.exists() else ""
    assert "=== kimi_batch spawn" not in log  # refused before the model load, not after
    _assert_nothing_recorded(manager)


@pytest.mark.parametrize("shares_port", [False, True], ids=["child-dies", "so-reuseport"])
def test_a_server_that_took_the_port_after_the_probe_is_not_taken_for_the_spawned_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shares_port: bool
) -> None:
    port = free_port()
    manager = _manager(tmp_path, port)
    # The other server serves the same model file: only whose process answers tells them apart.
    handler = _handler(str(manager.spec.model), down_first=True)
    # Sharing the port, ours binds beside the other at once; else it would die on the taken port,
    # but only long after the manager has met the other's answer (a loaded machine may start
    # the manager's probe a second late: a child dead first would be another test).
    monkeypatch.setenv("STANDIN_BIND_DELAY_S", "1.0" if shares_port else "30")
    monkeypatch.setenv("STANDIN_REUSE_PORT", "1" if shares_port else "0")
    # The pre-spawn check binds the port itself: it is free at that moment (the race).
    monkeypatch.setattr(server_module, "port_in_use", lambda host, port: False, raising=False)
    handle = None
    try:
        with (
            _other_server(port, handler, reuse_port=shares_port),
            pytest.raises(ServerSpawnError) as raised,
        ):
            handle = manager.ensure_running()
    finally:
        _stop_left_over(manager)
    assert handle is None
    message = str(raised.value)
    assert "\n" not in message
    assert f"port {port}" in message
    assert "KIMI_BATCH_LLAMA_PORT" in message
    _assert_nothing_recorded(manager)


def test_a_port_shared_with_another_listener_is_refused_when_attaching_to_our_own_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Our recorded server runs; a stranger started later shares its port (SO_REUSEPORT): the
    next start names the port instead of handing out a port that answers for two processes.
    Our server is left running (it is the stranger that must go)."""
    port = free_port()
    manager = _manager(tmp_path, port)
    monkeypatch.setenv("STANDIN_REUSE_PORT", "1")
    first = manager.ensure_running()
    try:
        assert first.spawned
        assert first.pid is not None
        handler = _handler(str(manager.spec.model), down_first=False)
        with (
            _other_server(port, handler, reuse_port=True),
            pytest.raises(ServerSpawnError) as raised,
        ):
            manager.ensure_running()
        record = manager._read_pid()
        assert record is not None
        assert record.pid == first.pid
        assert running(record)
    finally:
        _stop_left_over(manager)
    message = str(raised.value)
    assert "\n" not in message
    assert f"port {port}" in message


def test_a_server_of_our_own_on_a_free_port_starts_and_is_attached_again(tmp_path: Path) -> None:
    """The port-owner check recognises the spawned server's own listener."""
    manager = _manager(tmp_path, free_port())
    try:
        first = manager.ensure_running()
        second = manager.ensure_running()
        assert first.spawned
        assert not second.spawned
        assert first.pid == second.pid
        assert first.slots == SLOTS
    finally:
        assert manager.stop()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as probe_socket:
            if probe_socket.connect_ex(("127.0.0.1", manager.spec.port)) != 0:
                break
        time.sleep(0.05)
    else:
        raise AssertionError("the stand-in still listens after stop()")
    assert not os.path.exists(manager.pid_path)


def test_a_stranger_on_the_ipv6_wildcard_only_does_not_block_our_loopback_server(
    tmp_path: Path,
) -> None:
    """A service on `[::]:P` with IPV6_V6ONLY (nginx's `listen [::]:P`) takes no connection to
    127.0.0.1:P, and Linux gives one to an exact address's listener before a wildcard's anyway:
    the start was refused, the server it had spawned killed."""
    port = free_port()
    manager = _manager(tmp_path, port)
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as stranger:
        stranger.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        stranger.bind(("::", port))
        stranger.listen()
        try:
            handle = manager.ensure_running()
            assert handle.spawned
            assert handle.pid is not None
            record = manager._read_pid()
            assert record is not None
            assert running(record)
        finally:
            _stop_left_over(manager)


def test_a_server_running_the_slots_the_extra_arguments_give_serves_the_spec(
    tmp_path: Path,
) -> None:
    """A `-np` in the extra arguments overrides the settings' slots on the server's command
    line: a server of our model running that many slots is attached (it was refused as a
    different spec), one running the settings' count is not."""
    port = free_port()
    manager = _manager(tmp_path, port, "--parallel", "6")
    assert manager.spec.slots == 6
    with _other_server(port, _handler(str(manager.spec.model), down_first=False, slots=6)):
        handle = manager.ensure_running()
    assert (handle.spawned, handle.pid, handle.slots) == (False, None, 6)
    with (
        _other_server(port, _handler(str(manager.spec.model), down_first=False, slots=SLOTS)),
        pytest.raises(SpecMismatchError, match="slots=6"),
    ):
        manager.ensure_running()
