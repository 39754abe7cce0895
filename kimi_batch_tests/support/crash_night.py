"""One partition's night through the real storage and landing code, for the crash-point sweep.

    python -m kimi_batch_tests.support.crash_night     (a worker: the night once, in this process)

`run_night(settings)` does what a night does to the partition of `inbox/<DS>/<SOURCE>.jsonl`,
each step by the code the pipeline runs: the nightly look at the inbox (`land_inbox`: the file
assigned, its snapshot and version landed, its stat remembered), the partition's input resolved
(`resolve_partition`), the seeds and input quarantine landed unless they are current
(`seeds_are_current`, `land_input`), the distill stage's requests answered through the ledger
(the answer first recorded, `Ledger.put`, then read back), the stage landed (`land_stage`: its
rows through the quality gate, its quarantine, the duplicate index). Two things
are stand-ins, so that the sweep needs no server: the prompt-length check passes every seed (the
server's tokenizer), and an answer missing from the ledger is made up (the engine's), one of
them cut off at max_tokens so the stage sets it aside.

`check_night(settings)` asserts what must hold after any crash and one rerun (issue 42).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import dagster as dg
import polars as pl

from kimi_batch.defs.assets.batch import seeds_are_current
from kimi_batch.defs.assets.stage_asset import land_stage
from kimi_batch.defs.resources import TrinoResource, WarehouseResource
from kimi_batch.engine import GenerationResult, Ledger, row_request_id
from kimi_batch.engine.generation import request_key
from kimi_batch.inputs import Landing, land_inbox, land_input, resolve_partition
from kimi_batch.inputs.prompts import InputBatch, SeedPrompt
from kimi_batch.inputs.reader import InputReader
from kimi_batch.pipeline import INPUT_STAGE, DistillTask, HeldPartition, StagePlan
from kimi_batch.quality.dedup_index import index_entries
from kimi_batch.settings import Settings
from kimi_batch.warehouse import Warehouse, newest_snapshots, open_warehouse, tag_night
from kimi_batch_tests.support.quality import outcome_of
from kimi_batch_tests.support.results import make_result

__all__ = ["DS", "INBOX_LINES", "SOURCE", "check_night", "run_night", "write_inbox"]

DS = "2026-12-01"
SOURCE = "north"
KEY = f"{DS}|{SOURCE}"
MODEL, DIGEST = "smollm2", "d" * 64
# Good prompts, one repeated (the gate sets the second aside), one cut off (set aside by the
# stage), and two lines the reader quarantines.
INBOX_LINES = [
    json.dumps({"id": "n-1", "prompt": "Name three rivers in Africa and the seas they reach."}),
    "{not json",
    json.dumps({"id": "n-2", "prompt": "Explain how a lighthouse lens focuses its light."}),
    json.dumps({"id": "n-3", "prompt": "Name three rivers in Africa and the seas they reach."}),
    json.dumps({"id": "n-4", "prompt": "   "}),
    json.dumps({"id": "n-5", "prompt": "Write one sentence about a long, long winter."}),
]
CUT_OFF = "n-5"


def write_inbox(home: Path) -> Path:
    """The partition's inbox file (dated folder, whole: its mtime past the settle wait)."""
    path = home / "inbox" / DS / f"{SOURCE}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in INBOX_LINES), encoding="utf-8")
    os.utime(path, (1.0e9, 1.0e9))
    return path


def _all_fit(seeds: Sequence[SeedPrompt]) -> InputBatch:
    return InputBatch(seeds=list(seeds), quarantined=[])


def land_partition_seeds(settings: Settings, held: HeldPartition, store: Warehouse) -> bool:
    """What a night does to the partition's seeds (every prompt fitting the server): kept when
    its input version is consumed, else landed (`land_input`); True when they were landed."""
    resolved = resolve_partition(settings, DS, SOURCE)
    resource = WarehouseResource(deployment=settings)
    if seeds_are_current(resource, resolved):
        return False
    version = resolved.version
    assert version is not None
    now = datetime.now(UTC)
    with resource.landing() as landing:
        land_input(
            store,
            landing,
            DS,
            SOURCE,
            snapshot=version.path,
            reader=InputReader(source_name=resolved.assignment.name, now=now),
            input_sha256=version.sha256,
            check_lengths=_all_fit,
            now=now,
            set_aside=[],
            guard=held.lease,
        )
    return True


def _answers(task: DistillTask, inputs: Any, ledger: Ledger) -> list[GenerationResult]:
    """Each request's answer from the ledger, recorded there first when missing (the engine's
    order: the ledger before anything is landed); as the stage receives them."""
    results: list[GenerationResult] = []
    for request in task.requests(inputs):
        key = request_key(
            digest_sha256=DIGEST, model=MODEL, params=request.params, messages=request.messages
        )
        found = ledger.get_many([key]).get(key)
        if found is None:
            cut_off = request.input_id == CUT_OFF
            found = make_result(
                f"An answer to: {request.messages[-1].content}",
                request_id=key,
                input_id=request.input_id,
                tag=request.tag,
                finish_reason="length" if cut_off else "stop",
            )
            ledger.put(found)
        results.append(
            found.model_copy(
                update={
                    "request_id": row_request_id(key, request.input_id),
                    "input_id": request.input_id,
                    "tag": request.tag,
                }
            )
        )
    return results


def look_at_inbox(settings: Settings) -> None:
    """The nightly tick's look at the inbox (`land_inbox`): each settled file hashed, unless
    its stat is the one remembered, and landed when its content is new."""
    with Landing(settings.paths) as landing:
        land_inbox(
            landing,
            settings.paths.inbox_dir,
            max_bytes=settings.max_input_bytes,
            arrived=date.fromisoformat(DS),
            start=date.fromisoformat(DS),  # the partitions start by the night's date
        )


def run_night(settings: Settings, *, ttl_s: float = 60.0) -> None:
    """The partition's night (see the module's docstring); a rerun does what is left."""
    look_at_inbox(settings)
    store = open_warehouse(settings)
    task = DistillTask()
    with (
        Ledger(settings.paths.ledger_state) as ledger,
        ledger.lease(
            KEY, f"night-{os.getpid()}", ttl_s=ttl_s, wait_s=3 * ttl_s, poll_s=0.2
        ) as lease,
    ):
        held = HeldPartition(ledger=ledger, lease=lease)
        land_partition_seeds(settings, held, store)
        inputs = task.load(lambda table, model: store.read_rows(table, DS, SOURCE, model))
        results = _answers(task, inputs, ledger)
        plan = StagePlan(task, DS, SOURCE, inputs, list(task.requests(inputs)), _version(settings))
        land_stage(
            dg.build_op_context(),
            plan,
            held,
            outcome_of(results),
            results,
            store=store,
            trino=TrinoResource(deployment=settings),  # its table names only
            gate=WarehouseResource(deployment=settings).quality_gate(),
        )
    tag_night(store, DS)  # what the night published


def _version(settings: Settings) -> str:
    with WarehouseResource(deployment=settings).landing() as landing:
        current = landing.current(DS, SOURCE)
    assert current is not None
    return current.sha256


def check_night(settings: Settings) -> None:
    """Every input line a seed or a quarantined input line, every planned request once a row or a
    quarantine row with its reason, one version throughout, the ledger and the tables agreeing,
    the duplicate index holding the kept rows (none once the gate was off)."""
    store = open_warehouse(settings)
    sha = _version(settings)
    with WarehouseResource(deployment=settings).landing() as landing:
        assert landing.consumed(DS, SOURCE) == sha
    seeds = store.read_partition("seeds", DS, SOURCE)
    aside = store.read_partition("quarantine", DS, SOURCE)
    rejected = aside.filter(pl.col("stage") == INPUT_STAGE)
    lines = seeds["line"].to_list() + rejected["line"].to_list()
    assert sorted(lines) == list(range(1, len(INBOX_LINES) + 1)), lines
    assert set(seeds["input_sha256"]) | set(rejected["input_sha256"]) == {sha}
    task = DistillTask()
    inputs = task.load(lambda table, model: store.read_rows(table, DS, SOURCE, model))
    planned = {
        row_request_id(
            request_key(digest_sha256=DIGEST, model=MODEL, params=r.params, messages=r.messages),
            r.input_id,
        ): request_key(digest_sha256=DIGEST, model=MODEL, params=r.params, messages=r.messages)
        for r in task.requests(inputs)
    }
    distilled = store.read_partition("distilled", DS, SOURCE)
    set_aside = aside.filter(pl.col("stage") == task.name)
    ids = distilled["request_id"].to_list() + set_aside["request_id"].to_list()
    assert sorted(ids) == sorted(planned), (ids, planned)
    assert all(reason.strip() for reason in set_aside["reason"].to_list())
    assert set(distilled["input_sha256"]) == {sha}
    with Ledger(settings.paths.ledger_state) as ledger:
        recorded = ledger.get_many(planned.values())
    for row in distilled.iter_rows(named=True):
        assert recorded[planned[row["request_id"]]].text.strip() == row["response"]
    kept = distilled.height if settings.dedup else 0
    assert index_entries(settings.paths.dedup_state) == kept
    tables = {s.table: s for s in newest_snapshots(store)}
    assert set(tables) == {"seeds", "quarantine", "distilled"}
    assert all(s.night_snapshot_id == s.snapshot_id for s in tables.values()), tables


if __name__ == "__main__":
    run_night(Settings.from_env(), ttl_s=float(os.environ.get("CRASH_NIGHT_TTL_S", "60")))
