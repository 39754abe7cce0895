"""`bench --workload rewrite`: speculative decoding measured, with and without, in one run.

The copy-heavy rows (answers that restate their input) run greedy through the engine on the bench
server as configured, then on the same spec with `--spec-type` (the bench stops the first server
before starting the second: two servers on the same cores thrash), then plain again (the mean of
the two plain runs is the baseline; `plain_identical_fraction` is the run-to-run reproducibility
speculation is judged against). Reported: tok/s both ways, the drafted and accepted tokens per request (the rows' provenance columns), and the
fraction of answers that stayed byte-identical (speculation should not change greedy output; a
batch of several slots can, through floating-point batch effects).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kimi_batch.engine import BatchEngine, GenerationRequest, GenerationResult, Ledger
from kimi_batch.llama import ResidentServer
from kimi_batch_bench.contenders import BenchTarget, bench_target, erase_slots
from kimi_batch_bench.errors import BenchError
from kimi_batch_bench.workloads import Workload

__all__ = ["DEFAULT_SPEC_TYPE", "run_rewrite"]

DEFAULT_SPEC_TYPE = "ngram-simple"


def _engine_results(
    target: BenchTarget, requests: Sequence[GenerationRequest], ledger_path: Path
) -> tuple[list[GenerationResult], float]:
    """Every request through the engine on an empty ledger; (results, generation wall s)."""
    ledger_path.unlink(missing_ok=True)
    try:
        return asyncio.run(_run_engine(target, requests, ledger_path))
    finally:
        ledger_path.unlink(missing_ok=True)


async def _run_engine(
    target: BenchTarget, requests: Sequence[GenerationRequest], ledger_path: Path
) -> tuple[list[GenerationResult], float]:
    await erase_slots(target)
    with Ledger(ledger_path) as ledger:
        engine = BatchEngine(
            [target.endpoint], target.digest, ledger, digest_tokens=target.digest_tokens
        )
        started = time.perf_counter()
        outcome = await engine.run(requests)
        wall = time.perf_counter() - started
        results = list(outcome.iter_results(ledger))
    if outcome.failures:
        raise BenchError(f"engine failed {len(outcome.failures)} rewrite requests")
    warmup = sum(w.prefill_ms + w.save_ms + w.restore_ms for w in outcome.warmups) / 1000
    return results, wall - warmup


def _tok_s(results: Sequence[GenerationResult], wall_s: float) -> float:
    return sum(r.completion_tokens for r in results) / wall_s if wall_s > 0 else 0.0


def _plain_run(
    manager: ResidentServer, workload: Workload, digest_path: Path, work_dir: Path
) -> tuple[list[GenerationResult], float, BenchTarget]:
    """The workload through the engine on the plain server (started, then stopped)."""
    handle = manager.ensure_running()
    target = asyncio.run(bench_target(handle.base_url, handle.model, digest_path))
    results, wall = _engine_results(target, workload.requests, work_dir / "rewrite-plain.sqlite3")
    manager.stop()
    return results, wall, target


def run_rewrite(
    manager: ResidentServer,
    workload: Workload,
    *,
    digest_path: Path,
    spec_type: str,
    draft_model: Path | None,
    work_dir: Path,
) -> dict[str, Any]:
    """Plain, speculative, plain again; `manager`'s server runs on entry, stopped on return."""
    plain, plain_wall, target = _plain_run(manager, workload, digest_path, work_dir)
    spec = manager.spec.model_copy(update={"spec_type": spec_type, "draft_model": draft_model})
    speculating = ResidentServer(spec, work_dir / "server-spec", load_timeout_s=600)
    speculating.stop()  # one left behind by a killed bench
    spec_handle = speculating.ensure_running()
    try:
        spec_target = asyncio.run(
            bench_target(spec_handle.base_url, target.endpoint.model, digest_path)
        )
        drafted, spec_wall = _engine_results(
            spec_target, workload.requests, work_dir / "rewrite-spec.sqlite3"
        )
    finally:
        speculating.stop()
    # The plain run again after the speculative one: on a shared machine the load drifts, and the
    # mean of a run before and one after is what speculation is compared with.
    again, again_wall, _ = _plain_run(manager, workload, digest_path, work_dir)
    plain_runs = [_tok_s(plain, plain_wall), _tok_s(again, again_wall)]
    plain_text = {r.input_id: r.text for r in plain}
    identical = sum(1 for r in drafted if plain_text.get(r.input_id) == r.text)
    draft_n = sum(r.draft_tokens or 0 for r in drafted)
    accepted_n = sum(r.draft_accepted_tokens or 0 for r in drafted)
    engine_tok_s, spec_tok_s = sum(plain_runs) / 2, _tok_s(drafted, spec_wall)
    per_request = max(len(drafted), 1)
    return {
        "requests": len(workload.requests),
        "output_tokens": workload.output_tokens,
        "slots": target.endpoint.slots,
        "spec_type": spec_type,
        "draft_model": str(draft_model) if draft_model else None,
        "engine_tok_s": round(engine_tok_s, 2),
        "engine_spec_tok_s": round(spec_tok_s, 2),
        "spec_speedup": round(spec_tok_s / engine_tok_s, 4) if engine_tok_s else 0.0,
        "spec_acceptance": round(accepted_n / draft_n, 4) if draft_n else 0.0,
        "spec_drafted_per_request": round(draft_n / per_request, 1),
        "spec_accepted_per_request": round(accepted_n / per_request, 1),
        "spec_requests_with_drafts": sum(1 for r in drafted if r.draft_tokens),
        "spec_identical_fraction": round(identical / per_request, 4),
        "engine_tok_s_runs": [round(x, 2) for x in plain_runs],
        "plain_identical_fraction": round(
            sum(1 for r in again if plain_text.get(r.input_id) == r.text) / max(len(again), 1), 4
        ),
        "engine_wall_s": round(plain_wall, 2),
        "engine_spec_wall_s": round(spec_wall, 2),
    }
