"""Telling a hung server from a slow one: progress counters, not answers, while work is in flight.

A llama-server stopped with SIGSTOP (or wedged in its main loop) still accepts TCP connections,
so a request to it just waits. Its `/metrics` counters (`n_decode_total` grows with every decode
batch, prefill and generation alike) or, without `--metrics`, its `/slots` `n_decoded` stand
still. An endpoint whose counters do not move, or that does not answer the probe at all, for a
whole stall period while requests are in flight is hung. A refused connection or a 503 is not a
hang: the server is down or loading, and the send path handles that.

Why the stall default is long (10 minutes): the server answers `/metrics` and `/slots` between
decode batches only, and on the target one 2,048-token prefill batch at ~6 tok/s takes ~6 minutes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.llama import (
    LlamaClient,
    LlamaConnectionError,
    LlamaHTTPError,
    LlamaTimeoutError,
    LlamaUnsupportedError,
)

__all__ = ["EndpointWatch", "Probe", "WatchdogPolicy"]

logger = logging.getLogger(__name__)


class WatchdogPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    stall_s: float = Field(
        default=600.0, gt=0, description="No progress this long with work in flight = hung."
    )
    probe_timeout_s: float = Field(default=10.0, gt=0, description="One probe's time limit.")
    interval_s: float | None = Field(
        default=None, gt=0, description="Between probes; default stall/6, at most 15 s."
    )

    @property
    def every_s(self) -> float:
        return self.interval_s if self.interval_s is not None else min(self.stall_s / 6, 15.0)


class Probe(StrEnum):
    PROGRESS = "progress"  # answered, counters moved (or first sample)
    STILL = "still"  # answered, counters did not move
    SILENT = "silent"  # accepted the connection, no answer in time
    DOWN = "down"  # refused or loading: not a hang


class EndpointWatch:
    """Progress of one endpoint and the sends in flight on it."""

    def __init__(self, client: LlamaClient, policy: WatchdogPolicy) -> None:
        self.client = client
        self.policy = policy
        self.sending: dict[int, asyncio.Task[Any]] = {}  # slot id -> the send in flight
        self.ready = asyncio.Event()  # cleared while a hung server is restarted
        self.ready.set()
        self.hangs = 0
        self._signature: tuple[int, ...] | None = None
        self._use_metrics = True
        self._last_progress = time.monotonic()

    @property
    def base_url(self) -> str:
        return self.client.base_url

    def mark_progress(self) -> None:
        self._last_progress = time.monotonic()

    async def probe(self) -> Probe:
        timeout = self.policy.probe_timeout_s
        try:
            if self._use_metrics:
                try:
                    m = await self.client.metrics(timeout_s=timeout)
                    signature = (
                        int(m.n_decode_total),
                        int(m.tokens_predicted_total),
                        int(m.prompt_tokens_total),
                    )
                except LlamaUnsupportedError:
                    self._use_metrics = False  # no --metrics: /slots from now on
                    return Probe.PROGRESS
            else:
                slots = await self.client.slots(timeout_s=timeout)
                signature = tuple(v for s in slots for v in (s.id, s.id_task or -1, s.n_decoded))
        except LlamaTimeoutError:
            return Probe.SILENT
        except (LlamaConnectionError, LlamaHTTPError):
            return Probe.DOWN
        moved = signature != self._signature
        self._signature = signature
        return Probe.PROGRESS if moved else Probe.STILL

    async def stalled(self) -> bool:
        """One probe; True when the endpoint has been still for a whole stall period."""
        if not self.sending or not self.ready.is_set():
            self.mark_progress()  # idle or being restarted: the clock starts with new work
            return False
        state = await self.probe()
        if state in (Probe.PROGRESS, Probe.DOWN) or not self.sending:
            self.mark_progress()
            return False
        still_for = time.monotonic() - self._last_progress
        if still_for >= self.policy.stall_s:
            logger.warning(
                "%s made no progress for %.0f s with %d request(s) in flight (%s): hung",
                self.base_url,
                still_for,
                len(self.sending),
                state.value,
            )
            return True
        return False

    def cancel_sends(self) -> int:
        tasks = list(self.sending.values())
        for task in tasks:
            task.cancel()
        return len(tasks)
