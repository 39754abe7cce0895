"""Validating a large batch input through the API: this process's RSS growth, the wall time and
how other requests fare meanwhile (the API runs in this process, in a thread)."""

from __future__ import annotations

import gc
import json
import threading
import time
from pathlib import Path
from typing import Any

import openai

from kimi_batch.batch_api import ApiStore
from kimi_batch.settings import Settings
from kimi_batch_tests.support.api_server import serving_api
from kimi_batch_tests.support.batches import chat_line

__all__ = ["measure_validation", "write_batch_input"]

_REQUESTS = 50_000
_PAGE = 4096


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * _PAGE


def write_batch_input(path: Path, *, size_mb: int, requests: int = _REQUESTS) -> int:
    """`requests` valid lines of about equal length, `size_mb` MB in all (streamed to disk)."""
    per_line = size_mb * 1_000_000 // requests
    overhead = len(json.dumps(chat_line("r0000000", ""))) + 1
    words = ("the quick brown fox jumps over a lazy dog " * (per_line // 40 + 2))[
        : per_line - overhead
    ]
    with path.open("w", encoding="utf-8") as out:
        for i in range(requests):
            out.write(json.dumps(chat_line(f"r{i:07d}", words)) + "\n")
    return path.stat().st_size


class _RssPeak(threading.Thread):
    def __init__(self) -> None:
        super().__init__(name="rss-probe", daemon=True)
        self.peak = _rss_bytes()
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.01):
            self.peak = max(self.peak, _rss_bytes())


def measure_validation(settings: Settings, path: Path, key: str, *, size_mb: int) -> dict[str, Any]:
    size = write_batch_input(path, size_mb=size_mb)
    with ApiStore(settings.paths) as store, path.open("rb") as reader:
        upload = store.add_file(reader, filename=path.name, purpose="batch", max_bytes=size)
    path.unlink()
    with serving_api(settings) as url:
        client = openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=60)
        client.batches.list()  # warm: the first request's imports are not validation's
        gc.collect()
        baseline = _rss_bytes()
        probe = _RssPeak()
        probe.start()
        started = time.monotonic()
        batch = client.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        created_s = time.monotonic() - started
        answered, latencies = 0, list[float]()
        while True:
            asked = time.monotonic()
            batch = client.batches.retrieve(batch.id)
            client.files.list()
            latencies.append(time.monotonic() - asked)
            counts = batch.request_counts
            if batch.status != "validating" or (counts is not None and counts.total):
                break
            answered += 1
            time.sleep(0.05)
        wall = time.monotonic() - started
        probe.done.set()
        probe.join()
    return {
        "file_mb": round(size / 1e6, 1),
        "status": batch.status,
        "request_total": batch.request_counts.total if batch.request_counts else 0,
        "create_answered_s": round(created_s, 3),
        "wall_s": round(wall, 2),
        "rss_baseline_mb": round(baseline / 1e6, 1),
        "rss_peak_mb": round(probe.peak / 1e6, 1),
        "rss_growth_mb": round((probe.peak - baseline) / 1e6, 1),
        "answered_while_validating": answered,
        "max_request_s": round(max(latencies), 3),
        "median_request_s": round(sorted(latencies)[len(latencies) // 2], 3),
    }
