"""Materialize one partition in a fresh process and print the peak memory growth as JSON.

`python -m kimi_batch_tests.support.partition_memory_probe SOURCE ROWS N_PROBS MAX_TOKENS`: writes
ROWS short prompts to the inbox of $KIMI_BATCH_HOME, materializes `seed_prompts` and
`distilled_responses` of (today, SOURCE) on a temporary instance and reports the growth of the
kernel's peak RSS (VmHWM) over the materialization. A small partition runs first, and the peak is
reset after it (`/proc/self/clear_refs`), so the growth is what the partition's rows cost, not
Dagster's first-run imports.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import dagster as dg

from kimi_batch.definitions import batch_assets, build_resources
from kimi_batch.defs.partitions import SOURCE_PARTITIONS_NAME
from kimi_batch.settings import Settings

__all__ = ["main"]


def _kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _partition(instance: dg.DagsterInstance, source: str, rows: int, config: dict) -> dict:
    settings = Settings.from_env()
    inbox = settings.paths.inbox_dir
    inbox.mkdir(parents=True, exist_ok=True)
    lines = (
        json.dumps({"id": f"{source}-{i}", "prompt": f"Reply with only the word yes. (case {i})"})
        for i in range(rows)
    )
    (inbox / f"{source}.jsonl").write_text("\n".join(lines) + "\n")
    instance.add_dynamic_partitions(SOURCE_PARTITIONS_NAME, [source])
    result = dg.materialize(
        batch_assets(Settings.from_env()),
        selection=["seed_prompts", "distilled_responses"],
        partition_key=dg.MultiPartitionKey(
            {"date": settings.today().isoformat(), "source": source}
        ),
        resources=build_resources(Settings.from_env()),
        instance=instance,
        run_config={"ops": {"distilled_responses": {"config": config}}},
    )
    (event,) = result.asset_materializations_for_node("distilled_responses")
    return {key: value.value for key, value in event.metadata.items()}


def main(argv: list[str]) -> None:
    source, rows, n_probs, max_tokens = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    config = {"max_tokens": max_tokens, "n_probs": n_probs, "temperature": 0.0}
    with dg.instance_for_test() as instance:
        _partition(instance, f"{source}_warm", 20, config)
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
        before = _kib("VmHWM")
        meta = _partition(instance, source, rows, config)
        peak = _kib("VmHWM")
    report = {
        "rows": meta["rows"],
        "quarantined": meta["quarantined"],
        "generated": meta["generated"],
        "rss_before_mb": round(before / 1024, 1),
        "rss_peak_mb": round(peak / 1024, 1),
        "growth_mb": round((peak - before) / 1024, 1),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1:])
