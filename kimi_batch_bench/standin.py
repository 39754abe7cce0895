"""A time-scaled stand-in of the target: the llama-server API subset the engine uses, no model.

It answers `/health`, `/props`, `/slots` (with save/restore/erase), `/tokenize`,
`/v1/chat/completions` (with `usage` and `timings`) and `/metrics`, and takes as long as
Kimi-K2.5 on the 16-core EPYC 9175F would (`speed_model`, the model `plan` predicts with),
divided by `time_scale` (600: an hour in 6 s). The slots and the clock are `standin_slots`; the
tokenizer and the answers `standin_text`; this module is the HTTP side.

`timings` report target milliseconds; the stand-in's own figures (`kimi_standin_*` in
`/metrics`) give the busy time in target seconds.

A simulator for planning and rehearsal (`kimi-batch bench --workload rehearsal`); every test of
server behaviour uses the real llama-server. Stdlib asyncio only; it runs in a thread of the
caller (`StandinServer`) or alone (`python -m kimi_batch_bench.standin --port 8090`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import threading
import time
from types import TracebackType
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit

from kimi_batch_bench.speed_model import TargetProfile
from kimi_batch_bench.standin_slots import Simulator, SlotSpeeds, StandinHttpError
from kimi_batch_bench.standin_text import render_chat, standin_tokens

__all__ = ["SlotSpeeds", "StandinServer", "TargetProfile", "standin_tokens"]

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 500: "Internal Server Error"}


class StandinServer:
    """The stand-in on 127.0.0.1:`port`, served from a thread; a context manager."""

    def __init__(
        self,
        *,
        port: int,
        slots: int = 4,
        ctx: int = 16384,
        n_predict: int = 1024,
        time_scale: float = 600.0,
        profile: TargetProfile | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.host, self.port = host, port
        self.time_scale = time_scale
        self.profile = profile or TargetProfile()
        self._shape = (slots, ctx, n_predict)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self.sim: Simulator | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> Self:
        self._thread = threading.Thread(target=self._serve, name="standin", daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("stand-in server did not start")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(30)

    def _serve(self) -> None:
        asyncio.run(self.serve())

    async def serve(self) -> None:
        slots, ctx, n_predict = self._shape
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self.sim = Simulator(self.profile, slots, ctx // slots, n_predict, self.time_scale)
        clock = asyncio.create_task(self.sim.run())
        server = await asyncio.start_server(self._connection, self.host, self.port)
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            server.close()
            clock.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await clock

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers = {
                    k.strip().lower(): v.strip()
                    for k, _, v in (line.partition(":") for line in lines[1:] if line)
                }
                length = int(headers.get("content-length", "0"))
                body = await reader.readexactly(length) if length else b""
                status, payload = await self._handle(method, target, body)
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                kind = "text/plain" if isinstance(payload, bytes) else "application/json"
                writer.write(
                    f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
                    f"Content-Type: {kind}\r\nContent-Length: {len(data)}\r\n\r\n".encode()
                    + data
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    async def _handle(self, method: str, target: str, body: bytes) -> tuple[int, Any]:
        sim = self.sim
        assert sim is not None
        url = urlsplit(target)
        try:
            request = json.loads(body) if body else {}
            if url.path == "/health":
                return 200, {"status": "ok"}
            if url.path == "/props":
                return 200, {
                    "model_path": f"standin/{self.profile.name}.gguf",
                    "total_slots": len(sim.slots),
                    "default_generation_settings": {
                        "n_ctx": sim.ctx,
                        "params": {"n_predict": sim.n_predict},
                    },
                    "build_info": f"kimi-batch stand-in x{self.time_scale:g}",
                }
            if url.path == "/slots" and method == "GET":
                return 200, sim.slot_states()
            if url.path.startswith("/slots/") and method == "POST":
                action = parse_qs(url.query).get("action", [""])[0]
                slot_id = int(url.path.rsplit("/", 1)[1])
                if not 0 <= slot_id < len(sim.slots):
                    raise StandinHttpError(400, f"no slot {slot_id}")
                return 200, await sim.slot_action(slot_id, action, request.get("filename"))
            if url.path == "/tokenize":
                return 200, {"tokens": standin_tokens(str(request.get("content", "")))}
            if url.path == "/metrics":
                return 200, sim.metrics_text().encode()
            if url.path == "/v1/chat/completions" and method == "POST":
                slot = request.get("id_slot")
                task = sim.submit(
                    render_chat(list(request.get("messages", []))),
                    int(request.get("max_tokens") or sim.n_predict),
                    int(slot) if slot is not None and int(slot) >= 0 else None,
                )
                return 200, await task.done
        except StandinHttpError as error:
            return error.status, {"error": {"code": error.status, "message": error.message}}
        except (ValueError, KeyError, TypeError) as error:
            return 400, {"error": {"code": 400, "message": str(error)}}
        return 404, {"error": {"code": 404, "message": f"no route {method} {url.path}"}}


def main() -> None:
    parser = argparse.ArgumentParser(description="Time-scaled stand-in of the target server.")
    parser.add_argument("--port", type=int, default=8090)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--ctx", type=int, default=16384, help="Total context, shared by slots.")
    parser.add_argument("--time-scale", type=float, default=600.0)
    args = parser.parse_args()
    with StandinServer(
        port=args.port, slots=args.slots, ctx=args.ctx, time_scale=args.time_scale
    ) as server:
        print(f"stand-in on {server.base_url} (x{args.time_scale:g})", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)


if __name__ == "__main__":
    main()
