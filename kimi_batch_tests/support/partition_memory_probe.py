"""Materialize one partition in a fresh process and print the peak memory growth as JSON.

`python -m kimi_batch_tests.support.partition_memory_probe SOURCE ROWS N_PROBS MAX_TOKENS
[GENERATE]`: writes ROWS short prompts to the inbox of $KIMI_BATCH_HOME, materializes
`seed_prompts` and `distilled_responses` of (today, SOURCE) on a temporary instance and reports the
growth of the kernel's peak RSS (VmHWM) over the materialization. A small partition runs first, and
the peak is reset after it (`/proc/self/clear_refs`), so the growth is what the partition's rows
cost, not Dagster's first-run imports.

With GENERATE, all but the last GENERATE requests of the partition are written to the ledger
first, keyed exactly as the engine keys them (the rerun path: a partition killed near its end),
each with N_PROBS alternatives for each of its MAX_TOKENS tokens as a real answer has them,
so the measured run streams ROWS rows from the ledger to Parquet and generates only GENERATE of
them: the work, unlike the rows, does not depend on the machine's speed.
"""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import dagster as dg

from kimi_batch.definitions import batch_assets, build_resources
from kimi_batch.defs.partitions import SOURCE_PARTITIONS_NAME
from kimi_batch.defs.resources import DigestResource, LlamaServerResource, WarehouseResource
from kimi_batch.engine import BatchEngine, GenerationResult
from kimi_batch.llama import TokenLogprob, TopLogprob
from kimi_batch.pipeline import DistillConfig, plan_stage
from kimi_batch.settings import Settings

__all__ = ["main"]

# The first partition loads what every run loads (imports, first-run paths): one row a slot does.
WARM_ROWS = 4


def _kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _write_inbox(source: str, rows: int) -> None:
    inbox = Settings.from_env().paths.inbox_dir
    inbox.mkdir(parents=True, exist_ok=True)
    lines = (
        # The source in the text: the quality gate would set aside another partition's repeats.
        json.dumps(
            {"id": f"{source}-{i}", "prompt": f"Reply with only the word yes. ({source} {i})"}
        )
        for i in range(rows)
    )
    (inbox / f"{source}.jsonl").write_text("\n".join(lines) + "\n")


def _materialize(
    instance: dg.DagsterInstance, source: str, selection: list[str], config: dict[str, Any]
) -> dg.ExecuteInProcessResult:
    instance.add_dynamic_partitions(SOURCE_PARTITIONS_NAME, [source])
    return dg.materialize(
        batch_assets(Settings.from_env()),
        selection=selection,
        partition_key=dg.MultiPartitionKey(
            {"date": Settings.from_env().today().isoformat(), "source": source}
        ),
        resources=build_resources(Settings.from_env()),
        instance=instance,
        run_config={"ops": {"distilled_responses": {"config": config}}}
        if "distilled_responses" in selection
        else {},
    )


def _partition(
    instance: dg.DagsterInstance, source: str, rows: int, config: dict[str, Any]
) -> dict[str, Any]:
    _write_inbox(source, rows)
    result = _materialize(instance, source, ["seed_prompts", "distilled_responses"], config)
    (event,) = result.asset_materializations_for_node("distilled_responses")
    return {key: value.value for key, value in event.metadata.items()}


def _prefill_ledger(source: str, config: dict[str, Any], generate: int) -> int:
    """Write the partition's finished answers, all but the last `generate`, to the ledger."""
    settings = Settings.from_env()
    ds, store = settings.today().isoformat(), WarehouseResource(deployment=settings).warehouse()
    # The requests exactly as `distilled_responses` plans them from this run config (each
    # sampling one the partition's own sample).
    task = DistillConfig(**config).task(settings)
    requests = plan_stage(task, store, ds, source).requests
    digest = DigestResource(deployment=settings).load()
    prepared = asyncio.run(LlamaServerResource(deployment=settings).server().prepare(digest))
    with WarehouseResource(deployment=settings).ledger() as ledger:
        engine = BatchEngine(prepared.endpoints, digest, ledger, digest_tokens=0)
        planned = engine.plan(requests)[: max(0, len(requests) - generate)]
        for item in planned:
            answer = _answer(item.content_key, item.request.input_id, engine.model, digest)
            ledger.put(answer.model_copy(update={"logprobs": _logprobs(config)}))
    return len(planned)


def _logprobs(config: dict[str, Any]) -> list[TokenLogprob] | None:
    """What an answer of `max_tokens` tokens with `n_probs` alternatives each carries."""
    if not config["n_probs"]:
        return None
    top = [TopLogprob(token=f" t{k}", logprob=-1.0 - k, id=k) for k in range(config["n_probs"])]
    return [
        TokenLogprob(token=f" t{i}", logprob=-0.5, top=top, id=i)
        for i in range(config["max_tokens"])
    ]


def _answer(content_key: str, input_id: str, model: str, digest: Any) -> GenerationResult:
    return GenerationResult(
        request_id=content_key,
        input_id=input_id,
        tag="seed",
        model=model,
        digest_sha256=digest.sha256,
        text="yes",
        finish_reason="stop",
        prompt_tokens=20,
        cached_tokens=0,
        completion_tokens=2,
        prompt_ms=1.0,
        predicted_ms=1.0,
        latency_ms=2.0,
        endpoint="prefilled",
        slot_id=None,
        logprobs=None,
        created_at=datetime.now(UTC),
    )


def main(argv: list[str]) -> None:
    source, rows, n_probs, max_tokens = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    generate = int(argv[4]) if len(argv) > 4 else None
    config = {"max_tokens": max_tokens, "n_probs": n_probs, "temperature": 0.0}
    with dg.instance_for_test() as instance:
        _partition(instance, f"{source}_warm", WARM_ROWS, config)
        prefilled = 0
        if generate is not None:
            _write_inbox(source, rows)
            _materialize(instance, source, ["seed_prompts"], config)
            prefilled = _prefill_ledger(source, config, generate)
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
        before = _kib("VmHWM")
        meta = _partition(instance, source, rows, config)
        peak = _kib("VmHWM")
    report = {
        "rows": meta["rows"],
        "quarantined": meta["quarantined"],
        "generated": meta["generated"],
        "from_ledger": meta["from_ledger"],
        "prefilled": prefilled,
        "rss_before_mb": round(before / 1024, 1),
        "rss_peak_mb": round(peak / 1024, 1),
        "growth_mb": round((peak - before) / 1024, 1),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1:])
