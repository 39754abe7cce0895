"""Durable per-row ledger: every finished request is committed before the next one is counted.

SQLite in WAL mode with `synchronous=FULL`: a row is either committed (and skipped by every rerun)
or absent (and sent again), whatever kills the process. The key is the request's content hash, so
the same request in another partition or run is never generated twice either.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable
from pathlib import Path

from kimi_batch.engine.requests import GenerationResult

__all__ = ["Ledger"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    request_id  TEXT PRIMARY KEY,
    input_id    TEXT NOT NULL,
    result_json TEXT NOT NULL,
    finished_at REAL NOT NULL
)
"""


class Ledger:
    """Finished results keyed by request id."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        # Autocommit: each `put` is its own durable transaction.
        self._db = sqlite3.connect(path, isolation_level=None, timeout=60, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def put(self, result: GenerationResult) -> bool:
        """Record a finished result; False when the request was already recorded."""
        cursor = self._db.execute(
            "INSERT OR IGNORE INTO results (request_id, input_id, result_json, finished_at) "
            "VALUES (?, ?, ?, ?)",
            (result.request_id, result.input_id, result.model_dump_json(), time.time()),
        )
        return cursor.rowcount == 1

    def get_many(self, request_ids: Iterable[str]) -> dict[str, GenerationResult]:
        ids = list(dict.fromkeys(request_ids))
        found: dict[str, GenerationResult] = {}
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            placeholders = ",".join("?" * len(chunk))
            rows = self._db.execute(
                f"SELECT request_id, result_json FROM results WHERE request_id IN ({placeholders})",
                chunk,
            )
            for request_id, payload in rows:
                found[request_id] = GenerationResult.model_validate_json(payload)
        return found

    def count(self) -> int:
        return int(self._db.execute("SELECT count(*) FROM results").fetchone()[0])
