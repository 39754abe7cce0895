"""A time-scaled stand-in of the target: the llama-server API subset the engine uses, no model.

It answers `/health`, `/props`, `/slots` (with save/restore/erase), `/tokenize`,
`/v1/chat/completions` (with `usage` and `timings`) and `/metrics`, keeps a token list per slot
(so prefix reuse, the digest's restore and re-prefills behave as on llama-server), and takes as
long as Kimi-K2.5 on the 16-core EPYC 9175F would, divided by `time_scale` (600: an hour in 6 s).

Speeds follow the source document's CPU measurements, fitted with a per-token cost that grows
linearly with the context position (attention over the KV already in the slot):

- prefill: 0.0386 s + 1.54e-5 s x position per token. 823 tokens take 37 s (measured 22.2 tok/s),
  16,148 tokens 2,626 s = 44 min (measured 6.15 tok/s), a short prompt at 16.5k context 3.4 tok/s
  (measured 3.1-3.4).
- decode: 0.0759 s + 2.15e-5 s x position per token: 10.3 tok/s at 1k context (measured 10.27),
  8.7 at 1.8k (8.76), 2.3 at 16.5k (2.07-2.44).
- slots decoding together share one pass over the weights per step, but a MoE step with more
  tokens reads more experts: a step of n slots costs (1 + 0.6 (n - 1)) weight passes plus each
  slot's attention (`batch_decode_factor`; an assumption, the documents measure one stream).
- restoring a saved slot: 62 ms (the measured cache lookup).

Answers are deterministic text (a hash of the prompt) of exactly the asked length, ending as if
the model stopped there (`finish_reason` "stop"). `timings` report target milliseconds; the
stand-in's own figures (`kimi_standin_*` in `/metrics`) give the busy time in target seconds.

A simulator for planning and rehearsal (`kimi-batch bench --workload rehearsal`); every test of
server behaviour uses the real llama-server. Stdlib asyncio only; it runs in a thread of the
caller (`StandinServer`) or alone (`python -m kimi_batch.bench.standin --port 8090`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import re
import threading
import time
import zlib
from collections import deque
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["SlotSpeeds", "StandinServer", "TargetProfile", "standin_tokens"]

_TOKEN = re.compile(r"\s?\w{1,6}|\s+|[^\w\s]")
_WORDS = (
    "the", "model", "answer", "data", "batch", "night", "slot", "token", "cache", "value",
    "first", "then", "each", "which", "result", "given", "list", "return", "check", "input",
)  # fmt: skip
MAX_LAG_S = 2.0  # how far behind the wall clock the simulated steps may catch up
_DECODE_QUANTUM = 16  # decode tokens simulated per step when no prompt is being evaluated


class TargetProfile(BaseModel):
    """Per-token costs of the target in seconds; see the module docstring for the fit."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "kimi-k2.5-q4-epyc-9175f-th13"
    prefill_s: float = Field(default=0.03864, gt=0, description="Prompt token at position 0.")
    prefill_s_per_ctx: float = Field(default=1.5356e-5, ge=0)
    decode_s: float = Field(default=0.0759, gt=0, description="Generated token at position 0.")
    decode_s_per_ctx: float = Field(default=2.146e-5, ge=0)
    batch_decode_factor: float = Field(
        default=0.6, ge=0, le=1, description="Weight-pass cost of each extra decoding slot."
    )
    restore_s: float = Field(default=0.062, ge=0)
    n_batch: int = Field(default=2048, ge=32, description="Tokens of one step (--batch-size).")

    def prefill_cost(self, position: int, tokens: int) -> float:
        """Seconds to evaluate `tokens` prompt tokens starting at context `position`."""
        return tokens * self.prefill_s + self.prefill_s_per_ctx * (
            position * tokens + tokens * tokens / 2
        )

    def decode_step_cost(self, positions: list[int]) -> float:
        """Seconds of one decode step of the slots at these context positions."""
        weights = self.decode_s * (1 + self.batch_decode_factor * (len(positions) - 1))
        return weights + self.decode_s_per_ctx * sum(positions)


def standin_tokens(text: str) -> list[int]:
    """The stand-in's tokenizer: prefix-stable pieces (a word up to 6 letters, a space, a sign)."""
    return [zlib.crc32(piece.encode()) for piece in _TOKEN.findall(text)]


def _render(messages: list[dict[str, Any]]) -> str:
    parts = [
        f"<|im_start|>{m.get('role', 'user')}\n{m.get('content') or ''}<|im_end|>\n"
        for m in messages
    ]
    return "".join(parts) + "<|im_start|>assistant\n"


def _answer(prompt: str, tokens: int) -> str:
    digest = hashlib.sha256(prompt.encode()).digest()
    return "".join(" " + _WORDS[(digest[i % 32] + i) % len(_WORDS)] for i in range(tokens))


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


@dataclass
class _Task:
    id: int
    prompt: list[int]
    prompt_text: str
    max_tokens: int
    slot_id: int | None
    done: asyncio.Future[dict[str, Any]]
    cached: int = 0
    evaluated: int = 0
    decoded: int = 0
    prompt_s: float = 0.0
    decode_s: float = 0.0


@dataclass
class _Slot:
    id: int
    tokens: list[int] = field(default_factory=list)
    task: _Task | None = None


class SlotSpeeds(BaseModel):
    """Per-slot speeds of the rows answered so far, as llama-server's `timings` report them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rows: int
    prompt_tokens_per_row: float
    prompt_tok_s: float
    gen_tok_s: float


@dataclass
class _Answered:
    rows: int = 0
    evaluated: int = 0
    prompt_s: float = 0.0
    decoded: int = 0
    decode_s: float = 0.0

    def add(self, task: _Task) -> None:
        self.rows += 1
        self.evaluated += len(task.prompt) - task.cached
        self.prompt_s += task.prompt_s
        self.decoded += task.max_tokens
        self.decode_s += task.decode_s

    def speeds(self) -> SlotSpeeds:
        return SlotSpeeds(
            rows=self.rows,
            prompt_tokens_per_row=self.evaluated / self.rows if self.rows else 0.0,
            prompt_tok_s=self.evaluated / self.prompt_s if self.prompt_s else 1.0,
            gen_tok_s=self.decoded / self.decode_s if self.decode_s else 1.0,
        )


class _Simulator:
    """The slots and the virtual clock: one loop advances every busy slot step by step."""

    def __init__(self, profile: TargetProfile, slots: int, ctx: int, n_predict: int, scale: float):
        self.profile = profile
        self.scale = scale
        self.ctx = ctx
        self.n_predict = n_predict
        self.slots = [_Slot(i) for i in range(slots)]
        self.queue: deque[_Task] = deque()
        self.saves: dict[str, list[int]] = {}
        self.wake = asyncio.Event()
        self.next_task = 0
        self.prompt_tokens_total = 0
        self.tokens_predicted_total = 0
        self.n_decode_total = 0
        self.busy_target_s = 0.0
        self.answered = _Answered()

    # -- requests ------------------------------------------------------------------------------

    def submit(self, prompt_text: str, max_tokens: int, slot_id: int | None) -> _Task:
        self.next_task += 1
        cap = self.n_predict if self.n_predict > 0 else max_tokens
        task = _Task(
            id=self.next_task,
            prompt=standin_tokens(prompt_text),
            prompt_text=prompt_text,
            max_tokens=max(1, min(max_tokens, cap)),
            slot_id=slot_id,
            done=asyncio.get_running_loop().create_future(),
        )
        self.queue.append(task)
        self._assign()
        self.wake.set()
        return task

    def _assign(self) -> None:
        for task in list(self.queue):
            slot = self._slot_for(task)
            if slot is None:
                continue
            self.queue.remove(task)
            reuse = _common_prefix(slot.tokens, task.prompt)
            task.cached = min(reuse, len(task.prompt) - 1)  # at least one token is evaluated
            task.evaluated = len(task.prompt) - task.cached
            task.max_tokens = max(1, min(task.max_tokens, self.ctx - len(task.prompt)))
            slot.tokens = task.prompt[: task.cached]
            slot.task = task

    def _slot_for(self, task: _Task) -> _Slot | None:
        if task.slot_id is not None and 0 <= task.slot_id < len(self.slots):
            slot = self.slots[task.slot_id]
            return slot if slot.task is None else None
        idle = [s for s in self.slots if s.task is None]
        return max(idle, key=lambda s: _common_prefix(s.tokens, task.prompt), default=None)

    # -- the clock -----------------------------------------------------------------------------

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time()
        while True:
            busy = [s for s in self.slots if s.task is not None]
            if not busy:
                self.wake.clear()
                await self.wake.wait()
                due = loop.time()
                continue
            step = self._step(busy)
            self.busy_target_s += step
            # A step that ran late (a busy machine) is made up by the next ones, so target time
            # keeps pace with the wall clock the nightly window is measured on.
            due = max(due, loop.time() - MAX_LAG_S) + step / self.scale
            await asyncio.sleep(max(0.0, due - loop.time()))
            self._finish_done()

    def _step(self, busy: list[_Slot]) -> float:
        """Advance the busy slots by one llama.cpp step; returns its target seconds."""
        profile = self.profile
        decoding = [s for s in busy if s.task and s.task.evaluated == 0]
        prefilling = [s for s in busy if s.task and s.task.evaluated > 0]
        step = 0.0
        quantum = 1
        evaluating: list[_Task] = []
        if prefilling:
            budget = max(profile.n_batch - len(decoding), 1)
            for slot in prefilling:
                task = slot.task
                assert task is not None
                chunk = min(task.evaluated, budget)
                if chunk == 0:
                    break
                position = len(slot.tokens)
                cost = profile.prefill_cost(position, chunk)
                slot.tokens.extend(task.prompt[position : position + chunk])
                task.evaluated -= chunk
                evaluating.append(task)
                step += cost
                budget -= chunk
                self.prompt_tokens_total += chunk
        elif decoding:
            quantum = min(
                _DECODE_QUANTUM, *(s.task.max_tokens - s.task.decoded for s in decoding if s.task)
            )
        if decoding:
            positions = [len(s.tokens) for s in decoding]
            cost = profile.decode_step_cost(positions) * quantum
            step += cost
            self.n_decode_total += quantum
            for slot in decoding:
                task = slot.task
                assert task is not None
                slot.tokens.extend([0] * quantum)  # generated pieces: never matched by a prompt
                task.decoded += quantum
                self.tokens_predicted_total += quantum
        # Every slot of a step waits for all of it (a decode waits for another slot's prompt
        # chunk): llama-server's timings are wall time per phase, and so are these.
        for task in evaluating:
            task.prompt_s += step
        for slot in decoding:
            if slot.task is not None:
                slot.task.decode_s += step
        return step

    def _finish_done(self) -> None:
        finished = False
        for slot in self.slots:
            task = slot.task
            if task is None or task.evaluated > 0 or task.decoded < task.max_tokens:
                continue
            text = _answer(task.prompt_text, task.max_tokens)
            slot.tokens = task.prompt + standin_tokens(text)
            slot.task = None
            finished = True
            if task.max_tokens > 1:  # a digest warm-up or canary is not a row
                self.answered.add(task)
            if not task.done.done():
                task.done.set_result(self._response(slot.id, task, text))
        if finished:
            self._assign()

    def _response(self, slot_id: int, task: _Task, text: str) -> dict[str, Any]:
        evaluated = len(task.prompt) - task.cached
        prompt_ms, predicted_ms = task.prompt_s * 1000, task.decode_s * 1000
        return {
            "id": f"chatcmpl-standin-{task.id}",
            "object": "chat.completion",
            "model": "standin",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": text.strip()},
                }
            ],
            "usage": {
                "prompt_tokens": len(task.prompt),
                "completion_tokens": task.max_tokens,
                "total_tokens": len(task.prompt) + task.max_tokens,
                "prompt_tokens_details": {"cached_tokens": task.cached},
            },
            "timings": {
                "cache_n": task.cached,
                "prompt_n": evaluated,
                "prompt_ms": prompt_ms,
                "prompt_per_second": evaluated / task.prompt_s if task.prompt_s else None,
                "predicted_n": task.max_tokens,
                "predicted_ms": predicted_ms,
                "predicted_per_second": task.max_tokens / task.decode_s if task.decode_s else None,
            },
            "id_slot": slot_id,
        }

    # -- the other endpoints -------------------------------------------------------------------

    def slot_states(self) -> list[dict[str, Any]]:
        return [
            {
                "id": s.id,
                "n_ctx": self.ctx,
                "is_processing": s.task is not None,
                "id_task": s.task.id if s.task else -1,
                "next_token": {
                    "n_decoded": s.task.decoded if s.task else 0,
                    "n_remain": (s.task.max_tokens - s.task.decoded) if s.task else -1,
                    "has_next_token": s.task is not None,
                },
            }
            for s in self.slots
        ]

    async def slot_action(self, slot_id: int, action: str, filename: str | None) -> dict[str, Any]:
        slot = self.slots[slot_id]
        if slot.task is not None:
            raise _HttpError(400, f"slot {slot_id} is processing")
        if action == "save":
            self.saves[filename or ""] = list(slot.tokens)
            return {"id_slot": slot_id, "filename": filename, "n_saved": len(slot.tokens)}
        if action == "restore":
            if filename not in self.saves:
                raise _HttpError(400, f"no slot save {filename!r}")
            await asyncio.sleep(self.profile.restore_s / self.scale)
            slot.tokens = list(self.saves[filename])
            ms = self.profile.restore_s * 1000
            return {
                "id_slot": slot_id,
                "filename": filename,
                "n_restored": len(slot.tokens),
                "timings": {"restore_ms": ms},
            }
        if action == "erase":
            erased, slot.tokens = len(slot.tokens), []
            return {"id_slot": slot_id, "n_erased": erased}
        raise _HttpError(400, f"unknown slot action {action!r}")

    def metrics_text(self) -> str:
        processing = sum(1 for s in self.slots if s.task is not None)
        values = {
            "llamacpp:prompt_tokens_total": self.prompt_tokens_total,
            "llamacpp:tokens_predicted_total": self.tokens_predicted_total,
            "llamacpp:n_decode_total": self.n_decode_total,
            "llamacpp:requests_processing": processing,
            "llamacpp:requests_deferred": len(self.queue),
            "kimi_standin_busy_target_seconds_total": round(self.busy_target_s, 3),
            "kimi_standin_time_scale": self.scale,
        }
        return "".join(f"{name} {value}\n" for name, value in values.items())


class _HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


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
        self.sim: _Simulator | None = None

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
        self.sim = _Simulator(self.profile, slots, ctx // slots, n_predict, self.time_scale)
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
                    raise _HttpError(400, f"no slot {slot_id}")
                return 200, await sim.slot_action(slot_id, action, request.get("filename"))
            if url.path == "/tokenize":
                return 200, {"tokens": standin_tokens(str(request.get("content", "")))}
            if url.path == "/metrics":
                return 200, sim.metrics_text().encode()
            if url.path == "/v1/chat/completions" and method == "POST":
                slot = request.get("id_slot")
                task = sim.submit(
                    _render(list(request.get("messages", []))),
                    int(request.get("max_tokens") or sim.n_predict),
                    int(slot) if slot is not None and int(slot) >= 0 else None,
                )
                return 200, await task.done
        except _HttpError as error:
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
