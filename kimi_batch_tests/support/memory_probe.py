"""Run the input reader over one file in a fresh process and print its peak memory growth as JSON.

`python -m kimi_batch_tests.support.memory_probe FILE OUT_DIR [--whole]`: seeds are consumed in
chunks the way the pipeline lands them (each chunk written to a Parquet part in OUT_DIR and then
dropped); `--whole` uses `read_inbox_file` instead, to compare. The peak is the kernel's VmHWM,
so everything the reader allocates counts, Python objects and native buffers alike.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import polars as pl

from kimi_batch.inputs.reader import in_chunks, iter_inbox_rows, read_inbox_file
from kimi_batch.pipeline import QuarantineRow

__all__ = ["main"]


def _kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _write_part(out_dir: Path, index: int, seeds: list[tuple[str, str]]) -> None:
    frame = pl.DataFrame(seeds, schema=["input_id", "prompt"], orient="row")
    frame.write_parquet(out_dir / f"part-{index:05d}.parquet")


def main(argv: list[str]) -> None:
    path, out_dir, whole = Path(argv[0]), Path(argv[1]), "--whole" in argv
    # Warm up first (schemas built, polars loaded) so the baseline holds the code, not the data.
    warm = out_dir / "warm.jsonl"
    warm.write_text('{"id": "w", "prompt": "warm"}\n')
    _write_part(out_dir, 0, [(seed.input_id, seed.prompt) for seed in read_inbox_file(warm).seeds])
    before = _kib("VmHWM")
    seeds = 0
    quarantined: list[QuarantineRow] = []
    if whole:
        batch = read_inbox_file(path)
        seeds, quarantined = len(batch.seeds), batch.quarantined
    else:
        for index, chunk in enumerate(in_chunks(iter_inbox_rows(path)), start=1):
            seeds += len(chunk.seeds)
            quarantined.extend(chunk.quarantined)
            _write_part(out_dir, index, [(seed.input_id, seed.prompt) for seed in chunk.seeds])
    report = {
        "seeds": seeds,
        "quarantined": len(quarantined),
        "last_reason": quarantined[-1].reason if quarantined else None,
        "rss_before_mb": before / 1024,
        "rss_peak_mb": _kib("VmHWM") / 1024,
        "growth_mb": (_kib("VmHWM") - before) / 1024,
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1:])
