"""The stand-in's slots and virtual clock: a token list per slot, one loop stepping them.

Each slot keeps its tokens (so prefix reuse, the digest's restore and re-prefills behave as on
llama-server); one loop advances every busy slot by llama.cpp steps whose target seconds come
from `speed_model.TargetProfile`, and sleeps them divided by the time scale. Answers are
deterministic text of exactly the asked length, ending as if the model stopped there.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict

from kimi_batch_bench.speed_model import TargetProfile
from kimi_batch_bench.standin_text import answer_text, common_prefix, standin_tokens

__all__ = ["MAX_LAG_S", "Simulator", "SlotSpeeds", "StandinHttpError"]

MAX_LAG_S = 2.0  # how far behind the wall clock the simulated steps may catch up
_DECODE_QUANTUM = 16  # decode tokens simulated per step when no prompt is being evaluated


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
    cached_tokens_per_row: float
    prompt_tokens_per_row: float
    prompt_tok_s: float
    gen_tok_s: float


@dataclass
class _Answered:
    rows: int = 0
    cached: int = 0
    evaluated: int = 0
    prompt_s: float = 0.0
    decoded: int = 0
    decode_s: float = 0.0

    def add(self, task: _Task) -> None:
        self.rows += 1
        self.cached += task.cached
        self.evaluated += len(task.prompt) - task.cached
        self.prompt_s += task.prompt_s
        self.decoded += task.max_tokens
        self.decode_s += task.decode_s

    def speeds(self) -> SlotSpeeds:
        return SlotSpeeds(
            rows=self.rows,
            cached_tokens_per_row=self.cached / self.rows if self.rows else 0.0,
            prompt_tokens_per_row=self.evaluated / self.rows if self.rows else 0.0,
            prompt_tok_s=self.evaluated / self.prompt_s if self.prompt_s else 1.0,
            gen_tok_s=self.decoded / self.decode_s if self.decode_s else 1.0,
        )


class Simulator:
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
            reuse = common_prefix(slot.tokens, task.prompt)
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
        return max(idle, key=lambda s: common_prefix(s.tokens, task.prompt), default=None)

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
            text = answer_text(task.prompt_text, task.max_tokens)
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
            raise StandinHttpError(400, f"slot {slot_id} is processing")
        if action == "save":
            self.saves[filename or ""] = list(slot.tokens)
            return {"id_slot": slot_id, "filename": filename, "n_saved": len(slot.tokens)}
        if action == "restore":
            if filename not in self.saves:
                raise StandinHttpError(400, f"no slot save {filename!r}")
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
        raise StandinHttpError(400, f"unknown slot action {action!r}")

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


class StandinHttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
