"""The input reader's memory does not grow with the file (each run in its own process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from kimi_batch.inputs.reader import MAX_QUARANTINE_ROWS

pytestmark = [pytest.mark.slow, pytest.mark.no_llama_server]

FILE_BYTES = 200_000_000
MAX_GROWTH_MB = 300
BAD_EVERY = 150  # one bad line in 150: far more bad rows than the quarantine lists
_PAD = "Explain the reasoning step by step and keep the answer short. " * 5
# Each bad line is a different way to break a row; none may cost more than its own line.
_BAD_LINES = [
    b'{"id": "broken", "prompt": ',
    b"[" * 5000 + b"]" * 5000,
    b'{"id": "n", "prompt": "x", "seed": ' + b"9" * 5000 + b"}",
    b'{"id": "s", "prompt": "hi", "system": "\\ud800"}',
    b'{"id": "e", "prompt": "   "}',
    b'{"id": "r1", "prompt": "a duplicate id"}',
    b"caf\xe9 is not UTF-8",
]


def _write_jsonl(path: Path) -> tuple[int, int]:
    """~FILE_BYTES of short rows with bad lines mixed in; returns (good rows, bad rows)."""
    good = bad = number = written = 0
    with path.open("wb") as file:
        while written < FILE_BYTES:
            lines: list[bytes] = []
            for _ in range(20_000):
                number += 1
                if number % BAD_EVERY == 0:
                    lines.append(_BAD_LINES[bad % len(_BAD_LINES)])
                    bad += 1
                else:
                    row = {"id": f"r{number}", "prompt": f"Question {number}: {_PAD}"}
                    lines.append(json.dumps(row).encode())
                    good += 1
            data = b"\n".join(lines) + b"\n"
            file.write(data)
            written += len(data)
    return good, bad


def _probe(path: Path, out_dir: Path) -> dict[str, Any]:
    out_dir.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "kimi_batch_tests.support.memory_probe", str(path), str(out_dir)],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_large_jsonl_with_bad_lines_streams_in_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    good, bad = _write_jsonl(path)
    assert path.stat().st_size >= FILE_BYTES
    assert bad > MAX_QUARANTINE_ROWS

    report = _probe(path, tmp_path / "out")

    print(f"\n200 MB JSONL: {report}")
    assert report["seeds"] == good
    assert report["quarantined"] == MAX_QUARANTINE_ROWS + 1
    assert report["last_reason"].startswith(f"{bad - MAX_QUARANTINE_ROWS} more bad rows not listed")
    assert report["growth_mb"] < MAX_GROWTH_MB
    parts = pl.scan_parquet(tmp_path / "out" / "part-*.parquet").select(pl.len()).collect()
    assert parts.item() == good + 1  # + the warm-up row


def test_large_random_binary_named_jsonl_streams_in_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "noise.jsonl"
    with path.open("wb") as file:
        for _ in range(-(-FILE_BYTES // (1 << 24))):
            file.write(os.urandom(1 << 24))
    assert path.stat().st_size >= FILE_BYTES

    report = _probe(path, tmp_path / "out")

    print(f"\n200 MB random bytes: {report}")
    assert report["seeds"] == 0
    assert report["quarantined"] == MAX_QUARANTINE_ROWS + 1
    assert " more bad rows not listed" in report["last_reason"]
    assert report["growth_mb"] < MAX_GROWTH_MB
