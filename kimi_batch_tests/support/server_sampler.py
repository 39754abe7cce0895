"""What llama-server is doing, sampled in a thread while a test's runs go on."""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx

__all__ = ["ServerSampler", "sampling"]

_METRIC = re.compile(r"^llamacpp:(requests_processing|requests_deferred)\s+([0-9.eE+-]+)$", re.M)


@dataclass
class ServerSampler:
    """Polls llama-server's /slots and /metrics in a thread while the runs go on."""

    base_url: str
    headers: dict[str, str]
    interval_s: float = 0.2
    busy_slots: list[int] = field(default_factory=list)
    in_flight: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        with httpx.Client(base_url=self.base_url, headers=self.headers, timeout=5.0) as client:
            while not self._stop.is_set():
                try:
                    slots = client.get("/slots").json()
                    self.busy_slots.append(sum(1 for slot in slots if slot.get("is_processing")))
                    metrics = dict(_METRIC.findall(client.get("/metrics").text))
                    if metrics:
                        self.in_flight.append(
                            int(float(metrics.get("requests_processing", 0)))
                            + int(float(metrics.get("requests_deferred", 0)))
                        )
                except (httpx.HTTPError, ValueError) as error:
                    self.errors.append(repr(error))
                self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()


@contextlib.contextmanager
def sampling(base_url: str) -> Iterator[ServerSampler]:
    """A sampler of the server at `base_url` (with the environment's API key), running inside."""
    key = os.environ.get("KIMI_BATCH_LLAMA_API_KEY")
    sampler = ServerSampler(
        base_url=base_url, headers={"Authorization": f"Bearer {key}"} if key else {}
    )
    thread = threading.Thread(target=sampler.run, name="llama-sampler", daemon=True)
    thread.start()
    try:
        yield sampler
    finally:
        sampler.stop()
        thread.join(timeout=10)
