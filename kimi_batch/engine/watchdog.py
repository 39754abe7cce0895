"""Telling a hung server from a slow one: progress counters, not answers, while work is in flight.

A llama-server stopped with SIGSTOP (or wedged in its main loop) still accepts TCP connections,
so a request to it just waits. Its `/metrics` counters (`n_decode_total` grows with every decode
batch, prefill and generation alike; `prompt_tokens_total` with every evaluated prompt;
ik_llama.cpp, which has neither moving before a slot is released, `kv_cache_tokens`) or,
without `--metrics`, its `/slots` `n_decoded` and prompt progress (`n_past`, where the build
reports it) stand still. An endpoint whose counters do not move, or that does not answer the
probe at all, for a whole stall period while work is in flight (a request, or the digest
warm-up and restores) is hung. A refused connection or a 503 is not a hang: the server is down
or loading, and the send path handles that.

How long is a stall: the server answers `/metrics` and `/slots` between decode batches only, so
the period must outlast the slowest batch, one full `--batch-size` prompt batch. It is derived from
the measured prompt speed: 3 x (batch tokens / prompt tok/s), never under 60 s. On the target
(2,048 tokens at ~6 tok/s) that is ~17 minutes; on a small machine the floor, so a frozen server
is found in a minute. The speeds are those last measured by any batch or digest prefill of this
model (kept in the state dir, `speeds.py`), so a new step or run starts with its period; only a
model never measured here waits 600 s. An unreadable probe (an HTML
page from a proxy, a NaN counter) counts as no progress; the watchdog never ends a batch itself.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Coroutine
from enum import StrEnum
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.llama import (
    LlamaClient,
    LlamaConnectionError,
    LlamaHTTPError,
    LlamaTimeoutError,
    LlamaUnsupportedError,
)

# llama.cpp's default --batch-size: the prompt tokens one decode batch may hold.
DEFAULT_BATCH_TOKENS = 2048

_Done = TypeVar("_Done")
logger = logging.getLogger(__name__)


class WatchdogPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    stall_s: float | None = Field(
        default=None,
        gt=0,
        description="No progress this long with work in flight = hung; None: derived from the "
        "measured prompt speed (see `stall_for`).",
    )
    unmeasured_stall_s: float = Field(
        default=600.0, gt=0, description="The derived period until a prompt speed is measured."
    )
    floor_s: float = Field(default=60.0, gt=0, description="The derived period is never shorter.")
    batches: float = Field(
        default=3.0, ge=1.0, description="The derived period in full prompt batches."
    )
    probe_timeout_s: float = Field(default=10.0, gt=0, description="One probe's time limit.")
    interval_s: float | None = Field(
        default=None, gt=0, description="Between probes; default stall/6, at most 15 s."
    )

    @property
    def every_s(self) -> float:
        if self.interval_s is not None:
            return self.interval_s
        return min((self.stall_s or self.floor_s) / 6, 15.0)

    def stall_for(self, prompt_tok_s: float | None, batch_tokens: int) -> tuple[float, str]:
        """The stall period in force and why: fixed, or `batches` full prompt batches at the
        measured prompt speed (at least `floor_s`), or `unmeasured_stall_s` until measured."""
        if self.stall_s is not None:
            return self.stall_s, "fixed"
        if prompt_tok_s is None or not math.isfinite(prompt_tok_s) or prompt_tok_s <= 0:
            return self.unmeasured_stall_s, "no prompt speed measured yet"
        derived = self.batches * batch_tokens / prompt_tok_s
        return max(self.floor_s, derived), (
            f"{self.batches:g} x a {batch_tokens}-token batch at {prompt_tok_s:.0f} tok/s, "
            f"floor {self.floor_s:.0f} s"
        )


class Probe(StrEnum):
    PROGRESS = "progress"  # answered, counters moved (or first sample)
    STILL = "still"  # answered, counters did not move
    SILENT = "silent"  # accepted the connection, no answer in time
    DOWN = "down"  # refused or loading: not a hang


class EndpointWatch:
    """Progress of one endpoint and the sends in flight on it."""

    def __init__(
        self,
        client: LlamaClient,
        policy: WatchdogPolicy,
        *,
        prompt_tok_s: Callable[[], float | None] = lambda: None,
        batch_tokens: int = DEFAULT_BATCH_TOKENS,
    ) -> None:
        self.client = client
        self.policy = policy
        self.sending: dict[int, asyncio.Task[Any]] = {}  # slot id -> the send in flight
        # Slot id -> sha of the digest its KV is known to hold (absent: not known).
        self.digests: dict[int, str] = {}
        self.ready = asyncio.Event()  # cleared while a hung server is restarted
        self.ready.set()
        self.hangs = 0
        self._prompt_tok_s = prompt_tok_s
        self._batch_tokens = batch_tokens
        self._signature: tuple[int, ...] | None = None
        self._use_metrics = True
        self._last_progress = time.monotonic()
        self._announced: str | None = None
        self._unreadable_seen = False

    @property
    def base_url(self) -> str:
        return self.client.base_url

    @property
    def stall(self) -> tuple[float, str]:
        """(seconds, why) of the stall period in force now."""
        return self.policy.stall_for(self._prompt_tok_s(), self._batch_tokens)

    @property
    def stall_s(self) -> float:
        return self.stall[0]

    def describe_stall(self) -> str:
        seconds, why = self.stall
        return f"stall after {seconds:.0f} s ({why})"

    def mark_progress(self) -> None:
        self._last_progress = time.monotonic()

    async def watched(self, key: int, work: Coroutine[Any, Any, _Done]) -> asyncio.Task[_Done]:
        """Run `work` as the send in flight under `key`, once no restart is under way, and
        return its finished task: cancelled when the watchdog found the endpoint hung."""
        await self.ready.wait()  # never send to a server that is being restarted
        task = asyncio.create_task(work)
        if not self.sending:
            self.mark_progress()  # the stall clock starts with the first send in flight
        self.sending[key] = task
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:
            task.cancel()
            raise
        finally:
            self.sending.pop(key, None)
        return task

    async def _read_signature(self, timeout: float) -> tuple[int, ...] | None:
        """The progress counters; None when the server has no /metrics (then /slots is used)."""
        if self._use_metrics:
            try:
                m = await self.client.metrics(timeout_s=timeout)
            except LlamaUnsupportedError:
                self._use_metrics = False  # no --metrics: /slots from now on
                return None
            return (
                int(m.n_decode_total),
                int(m.tokens_predicted_total),
                int(m.prompt_tokens_total),
                int(m.kv_cache_tokens),
            )
        slots = await self.client.slots(timeout_s=timeout)
        return tuple(
            v for s in slots for v in (s.id, s.id_task or -1, s.n_decoded, s.prompt_progress)
        )

    async def probe(self) -> Probe:
        try:
            signature = await self._read_signature(self.policy.probe_timeout_s)
        except LlamaTimeoutError:
            return Probe.SILENT
        except (LlamaConnectionError, LlamaHTTPError):
            return Probe.DOWN
        except Exception as error:
            # An auth proxy's HTML page, a NaN counter: the answer says nothing about progress
            # (answers that arrive still do). Said once, not at every probe.
            level = logging.DEBUG if self._unreadable_seen else logging.WARNING
            self._unreadable_seen = True
            logger.log(
                level, "%s: unreadable progress probe (%s): no progress", self.base_url, error
            )
            return Probe.STILL
        if signature is None:
            return Probe.PROGRESS
        moved = signature != self._signature
        self._signature = signature
        return Probe.PROGRESS if moved else Probe.STILL

    async def stalled(self) -> bool:
        """One probe; True when the endpoint has been still for a whole stall period."""
        described = self.describe_stall()
        if described != self._announced:
            self._announced = described
            logger.info("%s: watchdog will %s", self.base_url, described)
        if not self.sending or not self.ready.is_set():
            self.mark_progress()  # idle or being restarted: the clock starts with new work
            return False
        state = await self.probe()
        if state in (Probe.PROGRESS, Probe.DOWN) or not self.sending:
            self.mark_progress()
            return False
        still_for = time.monotonic() - self._last_progress
        if still_for >= self.stall_s:
            logger.warning(
                "%s made no progress for %.0f s with %d request(s) in flight (%s; %s): hung",
                self.base_url,
                still_for,
                len(self.sending),
                state.value,
                described,
            )
            return True
        return False

    def cancel_sends(self) -> int:
        tasks = list(self.sending.values())
        for task in tasks:
            task.cancel()
        return len(tasks)
