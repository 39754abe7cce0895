"""`bench --workload api-prompts`: a Batch API file whose every line brings its own system
prompt, answered as the API answers it, and how busy that keeps the server's slots.

The batch is landed as the API lands one and `api_batch_responses` runs it in process on a
throwaway Dagster instance, on the bench's server. Each line's system prompt shares no more than its
first word with any other's (no line can reuse another's prefix). The figures: `max_in_flight`
(the engine's); `slot_occupancy`, the mean share of slots answering the batch's requests from
the first sent to the last answered (the requests' own times in the ledger); `busy_fraction`,
any slot processing (sampled from `/slots`, as the night measures it); what the prompts cost
(the engine's warm-ups, restores and one-off prefills, the server's own count of completions
and of evaluated prompt tokens); the wall; the slot-save files the batch left behind.

`python -m kimi_batch_bench.api_prompts --json F` runs it alone (a bench server of its own).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from kimi_batch.llama import LlamaClient
from kimi_batch.settings import Settings
from kimi_batch_bench.busy import SlotPoller

__all__ = ["api_prompt_lines", "api_prompts_alone", "run_api_prompts"]

_TOPICS = ("tides", "glaciers", "bridges", "compilers", "orchards", "comets", "violins", "maps")


def _slot_occupancy(settings: Settings, batch_id: str, slots: int) -> float:
    """The mean share of slots answering the batch's requests, from the first request sent
    to the last answer: the requests' own times (each result's latency, ending when it was
    recorded) summed over the span times the slots."""
    from kimi_batch.batch_api import ApiStore
    from kimi_batch.engine import Ledger

    with ApiStore(settings.paths) as store:
        keys = store.request_keys(batch_id)
    with Ledger(settings.paths.ledger_state) as ledger:
        results = ledger.get_many(keys.values()).values()
    spans = [
        (r.created_at.timestamp() - r.latency_ms / 1000, r.created_at.timestamp()) for r in results
    ]
    if not spans:
        return 0.0
    wall = max(end for _, end in spans) - min(start for start, _ in spans)
    return round(sum(end - start for start, end in spans) / (wall * slots), 3) if wall else 0.0


def api_prompt_lines(n: int, *, model: str, max_tokens: int) -> bytes:
    """`n` Batch API lines, each with a system prompt of its own (~40 tokens, none sharing
    more than its first word with another) and a short question."""
    rows = []
    for i in range(n):
        topic = _TOPICS[i % len(_TOPICS)]
        system = (
            f"Persona {i}: you are a patient teacher of {topic} who answers in plain words, "
            f"one sentence at a time, and never uses lists. Your learner is number {i}."
        )
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": f"What should I know first about {topic}?"},
        ]
        body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0}
        rows.append({"custom_id": f"line{i}", "method": "POST", "url": "/v1/chat/completions",
                     "body": body})  # fmt: skip
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def _server_counts(base_url: str, log: Path) -> dict[str, float]:
    """Completions the server launched (its log) and the prompt tokens it evaluated."""

    async def metrics() -> float:
        async with LlamaClient(base_url) as client:
            return (await client.metrics()).prompt_tokens_total

    launched = log.read_text(errors="replace").count("launch_slot_: id")
    return {"completions": launched, "prompt_tokens": asyncio.run(metrics())}


def _landed_batch(settings: Settings, data: bytes) -> str:
    """The batch landed as the API lands one; its id."""
    from kimi_batch.batch_api import ApiStore, validate_batch

    with ApiStore(settings.paths) as store:
        batch = store.add_upload_batch(data, filename="api_prompts.jsonl")
        landed = validate_batch(settings, store, batch)
    if landed.ds is None:
        raise RuntimeError(f"the bench batch did not validate: {landed.errors[:3]}")
    return landed.id


def _answer(settings: Settings, batch_id: str) -> tuple[dict[str, Any], float]:
    """Materialize the batch's partition in process; its metadata and wall seconds."""
    import dagster as dg

    from kimi_batch.definitions import build_resources
    from kimi_batch.defs.assets.api_batch import api_batch_responses
    from kimi_batch.defs.partitions import API_BATCH_PARTITIONS_NAME

    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(API_BATCH_PARTITIONS_NAME, [batch_id])
        started = time.perf_counter()
        result = dg.materialize(
            [api_batch_responses],
            partition_key=batch_id,
            resources=build_resources(settings),
            instance=instance,
        )
        wall = time.perf_counter() - started
    (materialized,) = result.asset_materializations_for_node("api_batch_responses")
    return {key: value.value for key, value in materialized.metadata.items()}, wall


def run_api_prompts(
    settings: Settings, *, base_url: str, slots: int, server_log: Path, lines: int, max_tokens: int
) -> dict[str, Any]:
    """One batch of `lines` lines, each with its own system prompt, on the running server of
    `settings` (`base_url`, `slots`, its log); the figures (see the module docstring)."""
    shutil.rmtree(settings.paths.ledger_dir, ignore_errors=True)  # every line is generated
    saves = settings.paths.slot_save_dir
    saved_before = set(saves.glob("*")) if saves.is_dir() else set()
    model = settings.model.name.removesuffix(".gguf") if settings.model else "any"
    batch_id = _landed_batch(settings, api_prompt_lines(lines, model=model, max_tokens=max_tokens))
    before = _server_counts(base_url, server_log)
    with SlotPoller(base_url) as poller:
        metadata, wall = _answer(settings, batch_id)
    after = _server_counts(base_url, server_log)
    left = set(saves.glob("*")) - saved_before if saves.is_dir() else set()
    figure_keys = ("generated", "max_in_flight", "system_prompts", "prompt_warmups",
                   "prompt_restores", "one_off_prompt_prefills", "slot_saves_peak",
                   "completion_tokens_per_s", "batch_status")  # fmt: skip
    return {
        "lines": lines,
        "max_tokens": max_tokens,
        "slots": slots,
        "wall_s": round(wall, 1),
        **{key: metadata[key] for key in figure_keys if key in metadata},
        "slot_occupancy": _slot_occupancy(settings, batch_id, slots),
        "busy_fraction": round(poller.timeline.busy_fraction(), 3),
        "server_completions": int(after["completions"] - before["completions"]),
        "server_prompt_tokens": int(after["prompt_tokens"] - before["prompt_tokens"]),
        "slot_saves_left": len(left),
        "slot_saves_max": getattr(settings, "slot_saves_max", None),
    }


def api_prompts_alone(local: Settings, *, lines: int, max_tokens: int) -> dict[str, Any]:
    """`run_api_prompts` on a server of its own, started from the bench's `local` settings
    and stopped at the end."""
    from kimi_batch.llama import ResidentServer, server_from_settings

    manager = server_from_settings(local, load_timeout_s=600)
    assert isinstance(manager, ResidentServer)
    manager.stop()  # a bench server left behind by a killed run
    try:
        handle = manager.ensure_running()
        return run_api_prompts(
            local,
            base_url=handle.base_url,
            slots=handle.slots,
            server_log=manager.log_path,
            lines=lines,
            max_tokens=max_tokens,
        )
    finally:
        manager.stop()


def main(argv: list[str] | None = None) -> int:
    """The workload alone, the figures as JSON (see the module docstring)."""
    from kimi_batch_bench.run import bench_settings

    parser = argparse.ArgumentParser(description="the api-prompts bench workload, alone")
    parser.add_argument("--lines", type=int, default=500)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    local = bench_settings(Settings.from_env())
    figures = api_prompts_alone(local, lines=args.lines, max_tokens=args.max_tokens)
    text = json.dumps({"api_prompts": figures}, indent=2)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
