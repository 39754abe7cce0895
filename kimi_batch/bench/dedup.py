"""`kimi-batch bench --workload dedup`: the duplicate index at scale, without a server.

Synthetic prompts (a fixed vocabulary, 20 to 60 words each) with planted repeats: every 20th row
is an exact copy of an earlier one (case and punctuation changed), every 20th after it a near
copy (one word added). Three figures: screening `rows` rows into a fresh index (exact check,
MinHash, LSH query, insert, committed), the index's size on disk and the process's peak memory,
and one `partition_rows`-row partition screened against the full index (the per-partition cost
a night pays: the index loaded, then its rows). rensa (the `bench` extra) is timed on the same
texts, MinHash and LSH in memory only, as the comparison the README's library choice cites.
"""

from __future__ import annotations

import random
import resource
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from kimi_batch.settings import Settings
from kimi_batch.storage.dedup_index import DedupIndex, IndexedText, shingles
from kimi_batch.tasks.amplify import normalize_text

__all__ = ["DedupBenchOptions", "dedup_table", "run_dedup_bench", "synthetic_prompts"]

_VOCABULARY = 20_000
_EVERY = 20


class DedupBenchOptions(BaseModel):
    rows: int = Field(default=100_000, ge=100)
    partition_rows: int = Field(default=1_000, ge=10)


def synthetic_prompts(rows: int, *, seed: int = 5) -> tuple[list[str], int, int]:
    """`rows` prompts and how many exact and near repeats were planted among them."""
    chooser = random.Random(seed)
    words = [f"w{index}" for index in range(_VOCABULARY)]
    prompts: list[str] = []
    exact = near = 0
    for index in range(rows):
        if index > _EVERY and index % _EVERY == 0:
            prompts.append(prompts[chooser.randrange(index - 1)].upper() + "?")
            exact += 1
        elif index > _EVERY and index % _EVERY == 1:
            prompts.append(prompts[chooser.randrange(index - 2)] + " again")
            near += 1
        else:
            prompts.append(" ".join(chooser.choices(words, k=chooser.randint(20, 60))))
    return prompts, exact, near


def _texts(prompts: list[str], prefix: str) -> Iterator[IndexedText]:
    for number, prompt in enumerate(prompts):
        request_id = f"{prefix}{number}"
        yield IndexedText(request_id=request_id, input_id=request_id, text=normalize_text(prompt))


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _rensa(prompts: list[str], threshold: float, shingle: int) -> dict[str, float] | None:
    try:
        import rensa  # pyright: ignore[reportMissingTypeStubs]
    except ImportError:
        return None
    started = time.perf_counter()
    lsh: Any = rensa.RMinHashLSH(threshold=threshold, num_perm=128, num_bands=16)
    found = 0
    for key, prompt in enumerate(prompts):
        minhash: Any = rensa.RMinHash(num_perm=128, seed=1)
        minhash.update([s.decode() for s in shingles(normalize_text(prompt), shingle)])
        if lsh.query(minhash):
            found += 1
            continue
        lsh.insert(key, minhash)
    elapsed = time.perf_counter() - started
    return {"rows_per_s": round(len(prompts) / elapsed), "s": round(elapsed, 2), "found": found}


def run_dedup_bench(settings: Settings, options: DedupBenchOptions) -> dict[str, Any]:
    """Screen the synthetic rows into a fresh index under the bench folder; the figures."""
    folder = settings.paths.bench_dir / "dedup"
    shutil.rmtree(folder, ignore_errors=True)
    index = DedupIndex(
        folder / "dedup.sqlite3",
        threshold=settings.dedup_threshold,
        shingle=settings.dedup_shingle,
        fields="prompt",
    )
    prompts, planted_exact, planted_near = synthetic_prompts(options.rows)
    rss_before = _peak_rss_mb()
    started = time.perf_counter()
    found = {"duplicate": 0, "near_duplicate": 0}
    with index.partition("2026-01-01", "bench") as screen:
        for text in _texts(prompts, "r"):
            match = screen.check(text)
            if match is not None:
                found[match.kind] += 1
    index_s = time.perf_counter() - started
    extra, _, _ = synthetic_prompts(options.partition_rows, seed=6)
    started = time.perf_counter()
    with index.partition("2026-01-02", "bench") as screen:
        load_s = time.perf_counter() - started
        for text in _texts(extra, "p"):
            screen.check(text)
    partition_s = time.perf_counter() - started
    document: dict[str, Any] = {
        "workload": "dedup",
        "rows": options.rows,
        "threshold": settings.dedup_threshold,
        "shingle": settings.dedup_shingle,
        "index_s": round(index_s, 2),
        "index_rows_per_s": round(options.rows / index_s),
        "index_mb": round(index.size_bytes() / 2**20, 1),
        "peak_rss_mb": round(_peak_rss_mb(), 1),
        "rss_growth_mb": round(_peak_rss_mb() - rss_before, 1),
        "planted_exact": planted_exact,
        "planted_near": planted_near,
        "found_exact": found["duplicate"],
        "found_near": found["near_duplicate"],
        "partition_rows": options.partition_rows,
        "partition_s": round(partition_s, 2),
        "partition_load_s": round(load_s, 2),
    }
    compared = _rensa(prompts, settings.dedup_threshold, settings.dedup_shingle)
    if compared is not None:
        document["rensa"] = compared
        document["rensa_over_datasketch"] = round(
            compared["rows_per_s"] / document["index_rows_per_s"], 1
        )
    return document


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
            f"one {document['partition_rows']:,}-row partition against the index",
            f"{document['partition_s']} s (loading {document['partition_load_s']} s)",
        ),
    ]
    if "rensa" in document:
        rensa = document["rensa"]
        rows.append(
            (
                "rensa, in memory only (MinHash + LSH)",
                f"{rensa['rows_per_s']:,} rows/s, {document['rensa_over_datasketch']}x",
            )
        )
    lines = ["| dedup | |", "| --- | --- |", *(f"| {name} | {value} |" for name, value in rows)]
    return "\n".join(lines) + "\n"


def write_dedup_outputs(document: dict[str, Any], json_path: Path) -> tuple[Path, Path]:
    import json

    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(document, indent=2, sort_keys=True))
    table_path = json_path.with_suffix(".md")
    table_path.write_text(dedup_table(document))
    return json_path, table_path
