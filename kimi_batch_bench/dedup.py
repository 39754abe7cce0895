"""`kimi-batch bench --workload dedup`: the duplicate index at scale, without a server.

Synthetic prompts (words drawn Zipf-like from a 20,000-word vocabulary, 20 to 60 each) with planted
repeats: every 20th row an exact copy of an earlier one (case and spacing changed), every 20th
after it a near copy (a word added). The rows are screened into a fresh index as nights would,
`partition_rows` a partition, each in its own transaction; then one more partition of fresh rows
against the full index: the per-partition cost a night pays, to compare with the first
partition's (the index nearly empty). Also measured: the index's size on disk, the process's peak
memory, what the other design would pay per partition before its first row (every kept signature
loaded into datasketch's in-memory `MinHashLSH`), and MinHash signatures alone, datasketch's
against rensa's (the `bench` extra), on the same texts: the README's library choice cites them.
"""

from __future__ import annotations

import json
import random
import resource
import shutil
import sqlite3
import time
from collections.abc import Iterator
from datetime import date, timedelta
from itertools import accumulate
from pathlib import Path
from typing import Any

import numpy as np
from datasketch import LeanMinHash, MinHash, MinHashLSH
from pydantic import BaseModel, Field

from kimi_batch.paths import StateLocation
from kimi_batch.quality import DedupIndex, DedupSetting, IndexedText, normalize_text, shingles
from kimi_batch.settings import Settings

__all__ = [
    "DedupBenchOptions",
    "dedup_table",
    "run_dedup_bench",
    "synthetic_prompts",
    "write_dedup_outputs",
]

_VOCABULARY = 20_000
_EVERY = 20
_SIGNATURE_SAMPLE = 20_000  # texts the two libraries' signatures are timed on
_FIRST_DAY = date(2026, 1, 1)


class DedupBenchOptions(BaseModel):
    rows: int = Field(default=100_000, ge=100, description="Rows screened into the index.")
    partition_rows: int = Field(default=1_000, ge=10, description="Rows of each partition.")


def synthetic_prompts(rows: int, *, seed: int = 5) -> tuple[list[str], int, int]:
    """`rows` prompts and how many exact and near repeats were planted among them."""
    chooser = random.Random(seed)
    words = [f"w{index}" for index in range(_VOCABULARY)]
    # Zipf-like: a few words are everywhere (cumulative weights, summed once).
    cumulative = list(accumulate(1 / (rank + 1) for rank in range(_VOCABULARY)))
    prompts: list[str] = []
    exact = near = 0
    for index in range(rows):
        if index > _EVERY and index % _EVERY == 0:
            # Case and spacing only: the exact key keeps punctuation ("?" added is another text).
            prompts.append(prompts[chooser.randrange(index - 1)].upper().replace(" ", "  "))
            exact += 1
        elif index > _EVERY and index % _EVERY == 1:
            prompts.append(prompts[chooser.randrange(index - 2)] + " again")
            near += 1
        else:
            length = chooser.randint(20, 60)
            prompts.append(" ".join(chooser.choices(words, cum_weights=cumulative, k=length)))
    return prompts, exact, near


def _texts(prompts: list[str], prefix: str) -> Iterator[IndexedText]:
    for number, prompt in enumerate(prompts):
        request_id = f"{prefix}{number}"
        yield IndexedText(request_id=request_id, input_id=request_id, text=normalize_text(prompt))


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _screen(index: DedupIndex, day: int, texts: list[IndexedText], found: dict[str, int]) -> float:
    """One partition screened and committed; its seconds."""
    started = time.perf_counter()
    with index.partition(str(_FIRST_DAY + timedelta(days=day)), "bench") as screen:
        for text in texts:
            match = screen.check(text)
            if match is not None:
                found[match.kind] += 1
    return time.perf_counter() - started


def _in_memory_load_s(path: Path, setting: DedupSetting) -> float:
    """The other design's cost before a partition's first row: every kept signature read and
    put in datasketch's in-memory LSH (the WIP design this index replaced)."""
    started = time.perf_counter()
    lsh = MinHashLSH(threshold=setting.threshold, num_perm=128)
    db = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    try:
        for kept, blob in db.execute("SELECT id, signature FROM kept"):
            values = np.frombuffer(blob, dtype=np.uint32).astype(np.uint64)
            lsh.insert(kept, LeanMinHash(seed=1, hashvalues=values, scheme="affine32"))
    finally:
        db.close()
    return time.perf_counter() - started


def _signatures(prompts: list[str], shingle: int) -> dict[str, int]:
    """MinHash signatures per second on the same texts: datasketch (as the index makes them)
    and rensa, when installed (the `bench` extra)."""
    texts = [shingles(normalize_text(prompt), shingle) for prompt in prompts[:_SIGNATURE_SAMPLE]]
    permutations = MinHash(num_perm=128, seed=1).permutations
    started = time.perf_counter()
    for grams in texts:
        MinHash(num_perm=128, seed=1, permutations=permutations, scheme="affine32").update_batch(
            grams
        )
    figures = {"datasketch_rows_per_s": round(len(texts) / (time.perf_counter() - started))}
    try:
        import rensa  # pyright: ignore[reportMissingTypeStubs]
    except ImportError:
        return figures
    decoded = [[gram.decode() for gram in grams] for grams in texts]
    started = time.perf_counter()
    for grams in decoded:
        minhash: Any = rensa.RMinHash(num_perm=128, seed=1)  # pyright: ignore[reportAttributeAccessIssue]
        minhash.update(grams)
        minhash.digest()
    figures["rensa_rows_per_s"] = round(len(texts) / (time.perf_counter() - started))
    return figures


def run_dedup_bench(settings: Settings, options: DedupBenchOptions) -> dict[str, Any]:
    """Screen the synthetic rows into a fresh index under the bench folder; the figures."""
    folder = settings.paths.bench_dir / "dedup"
    shutil.rmtree(folder, ignore_errors=True)
    setting = DedupSetting(
        threshold=settings.dedup_threshold, shingle=settings.dedup_shingle, fields="prompt"
    )
    # Always a fresh SQLite file: the figures are the index's own, not a database server's.
    index = DedupIndex(StateLocation(path=folder / "dedup.sqlite3", schema_name="bench"), setting)
    prompts, planted_exact, planted_near = synthetic_prompts(options.rows)
    texts = list(_texts(prompts, "r"))
    size = options.partition_rows
    found = {"duplicate": 0, "near_duplicate": 0}
    started = time.perf_counter()
    partition_s = [
        _screen(index, day, texts[start : start + size], found)
        for day, start in enumerate(range(0, len(texts), size))
    ]
    index_s = time.perf_counter() - started
    extra, _, _ = synthetic_prompts(size, seed=6)
    last_s = _screen(index, len(partition_s), list(_texts(extra, "p")), dict(found))
    bands, rows_per_band = setting.bands()
    return {
        "workload": "dedup",
        "rows": options.rows,
        "threshold": setting.threshold,
        "shingle": setting.shingle,
        "bands": f"{bands}x{rows_per_band}",
        "index_s": round(index_s, 2),
        "index_rows_per_s": round(options.rows / index_s),
        "index_mb": round(index.size_bytes() / 2**20, 1),
        "peak_rss_mb": round(_peak_rss_mb(), 1),
        "planted_exact": planted_exact,
        "planted_near": planted_near,
        "found_exact": found["duplicate"],
        "found_near": found["near_duplicate"],
        "partition_rows": size,
        "first_partition_s": round(partition_s[0], 3),
        "partition_s": round(last_s, 3),
        "in_memory_load_s": round(_in_memory_load_s(index.location.path, setting), 2),
        **_signatures(prompts, setting.shingle),
    }


def dedup_table(document: dict[str, Any]) -> str:
    rows = [
        ("rows screened into a fresh index", f"{document['rows']:,}"),
        ("wall", f"{document['index_s']} s ({document['index_rows_per_s']:,} rows/s)"),
        ("index on disk", f"{document['index_mb']} MB"),
        ("peak memory of the process", f"{document['peak_rss_mb']} MB"),
        (
            "planted repeats found (exact, near)",
            f"{document['found_exact']}/{document['planted_exact']}, "
            f"{document['found_near']}/{document['planted_near']}",
        ),
        (
            f"one {document['partition_rows']:,}-row partition: first, then against the index",
            f"{document['first_partition_s']} s, {document['partition_s']} s",
        ),
        ("in-memory LSH instead: loading the index first", f"{document['in_memory_load_s']} s"),
        ("MinHash signatures, datasketch", f"{document['datasketch_rows_per_s']:,} rows/s"),
    ]
    if "rensa_rows_per_s" in document:
        rows.append(("MinHash signatures, rensa", f"{document['rensa_rows_per_s']:,} rows/s"))
    lines = ["| dedup | |", "| --- | --- |", *(f"| {name} | {value} |" for name, value in rows)]
    return "\n".join(lines) + "\n"


def write_dedup_outputs(document: dict[str, Any], json_path: Path) -> tuple[Path, Path]:
    """The figures as JSON (`{"dedup": ...}`) and as a Markdown table beside it."""
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps({"dedup": document}, indent=2, sort_keys=True))
    table_path = json_path.with_suffix(".md")
    table_path.write_text(dedup_table(document))
    return json_path, table_path
