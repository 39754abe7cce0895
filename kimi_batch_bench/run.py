"""`kimi-batch bench`: every contender on one server, one digest, the same prompts and lengths.

The bench owns its server: spawned from the configured spec into `$KIMI_BATCH_HOME/bench` on a
free port, with `--ignore-eos` (every answer is exactly max_tokens long, so tokens compare) and
no RAM prompt cache (a later contender must not find an earlier one's prompts there); stopped at
the end. Contenders run one after another from erased slots.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.llama import (
    LlamaClient,
    ResidentServer,
    ServerSpec,
    format_cpu_list,
    server_from_settings,
)
from kimi_batch.settings import Settings
from kimi_batch_bench.api_prompts import api_prompts_alone
from kimi_batch_bench.children import signals_as_exit
from kimi_batch_bench.contenders import (
    BenchTarget,
    bench_target,
    run_all_slots,
    run_dagster,
    run_engine,
    run_naive,
)
from kimi_batch_bench.errors import BenchError
from kimi_batch_bench.measure import ContenderReport
from kimi_batch_bench.night import run_night
from kimi_batch_bench.plan import PlanInput, Speeds, plan_partition, save_speeds
from kimi_batch_bench.ports import free_port
from kimi_batch_bench.rehearsal import RehearsalOptions, run_rehearsal
from kimi_batch_bench.rewrite import DEFAULT_SPEC_TYPE, run_rewrite
from kimi_batch_bench.sweeps import batched_bench
from kimi_batch_bench.workloads import (
    Workload,
    WorkloadName,
    amplify_workload,
    distill_workload,
    judge_workload,
    rewrite_workload,
)

__all__ = ["BenchOptions", "run_bench"]

logger = logging.getLogger(__name__)

# The distillation prompts are an inbox file: the Dagster contender's partition.
DISTILL_FILE = "bench_distill.jsonl"


class BenchOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    workloads: tuple[WorkloadName, ...] = ("distill", "amplify")
    rows: int = Field(default=24, ge=1, description="Distillation prompts.")
    output_tokens: int = Field(default=64, ge=1, description="Distillation answer length.")
    seeds_per_slot: int = Field(default=2, ge=1, description="Amplification seeds per slot.")
    variants: int = Field(default=3, ge=1, description="Variants per strategy and seed.")
    amplify_output_tokens: int = Field(default=32, ge=1)
    dagster: bool = True
    ceiling: bool = True
    rewrite_rows: int = Field(default=20, ge=1, description="Copy-heavy rows (rewrite).")
    rewrite_output_tokens: int = Field(default=160, ge=1)
    night_partitions: int = Field(default=12, ge=1, description="Partitions of the night.")
    night_rows: int = Field(default=4, ge=1, description="Seed rows per night partition.")
    night_output_tokens: int = Field(
        default=32, ge=1, description="The night's server --n-predict (every answer's length)."
    )
    night_pinning: Literal["configured", "both"] = Field(
        default="configured",
        description="configured: KIMI_BATCH_LLAMA_CPUS as set (unset: unpinned); both: the "
        "night unpinned, then pinned (that set, else every CPU but the first), back to back.",
    )
    api_lines: int = Field(default=500, ge=1, description="api-prompts: lines, each its prompt.")
    api_output_tokens: int = Field(default=8, ge=1, description="api-prompts: answer length.")
    rehearsal: RehearsalOptions = Field(default_factory=RehearsalOptions)
    spec_type: str | None = Field(
        default=None, description="--spec-type of the rewrite run; default KIMI_BATCH_LLAMA_SPEC."
    )
    tool_args: tuple[str, ...] = Field(
        default=(),
        description="More arguments for the ceiling's llama-batched-bench (the model flags the "
        "server gets from KIMI_BATCH_LLAMA_EXTRA_ARGS), last on its command line.",
    )


def bench_settings(
    settings: Settings, *, n_predict: int | None = None, ignore_eos: bool = True
) -> Settings:
    """The configured server in its own state dir, with fixed answer lengths and no RAM cache.

    `ignore_eos=False` (the night): answers end where the model ends them, within their budget.

    No attached or scale-out server, warehouse override, state database or Trino: those would
    take the bench's runs (and their ledger rows) elsewhere. Contender (D)'s Dagster resources are built from these settings too.
    """
    return settings.model_copy(
        update={
            "home": settings.paths.bench_dir / "state",
            "llama_port": free_port(),
            "llama_extra_args": (
                (*settings.llama_extra_args, "--ignore-eos")
                if ignore_eos
                else settings.llama_extra_args
            ),
            "llama_cache_ram_mib": 0,
            "llama_n_predict": settings.llama_n_predict if n_predict is None else n_predict,
            "llama_url": None,
            "llama_extra_urls": (),
            "warehouse": None,
            "database_url": None,
            "trino_host": None,
        }
    )


async def _user_tokens(target: BenchTarget, workload: Workload) -> float:
    async with LlamaClient(target.endpoint.base_url) as client:
        counts = [
            len(await client.tokenize("\n".join(m.content for m in request.messages)))
            for request in workload.requests
        ]
    return sum(counts) / len(counts)


def _ratio(a: float, b: float) -> float:
    return round(a / b, 4) if b else 0.0


def _ceiling(
    settings: Settings,
    target: BenchTarget,
    prompt_tokens: int,
    output_tokens: int,
    spec: ServerSpec,
    tool_args: tuple[str, ...],
) -> dict[str, Any]:
    """llama-batched-bench's speed at the server's slots, with its build's tool and its flash
    attention (a ceiling measured with the other setting is no ceiling: off decoded 2.6x faster
    here)."""
    assert settings.model is not None
    threads = min(settings.llama_threads, os.cpu_count() or 1)
    points = batched_bench(
        settings.model,
        slots=[target.endpoint.slots],
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        threads=threads,
        ctx_per_slot=target.endpoint.ctx or 2048,
        flash_attn=spec.flash_attn,
        server=spec.binary,
        extra_args=tool_args,
    )
    return points[-1].model_dump()


def _plan_check(target: BenchTarget, workload: Workload, engine: ContenderReport) -> dict[str, Any]:
    """What `plan` predicts from this run's own per-slot speeds, against the engine's wall."""
    predicted = plan_partition(
        PlanInput(
            prompt_tokens=round(engine.prompt_tokens_evaluated / max(engine.requests, 1)),
            output_tokens=workload.output_tokens,
            rows=engine.requests,
            prompt_tok_s=max(engine.prompt_tok_s, 1e-6),
            gen_tok_s=max(engine.slot_gen_tok_s, 1e-6),
            slots=target.endpoint.slots,
        )
    )
    return {
        "plan_predicted_wall_s": round(predicted.wall_s, 2),
        "engine_wall_s": round(engine.wall_s, 2),
        "plan_error": _ratio(predicted.wall_s - engine.wall_s, engine.wall_s),
    }


def _dagster_contender(
    settings: Settings, workload: Workload, engine: ContenderReport, section: dict[str, Any]
) -> ContenderReport:
    """The same prompts as a Dagster partition run; its figures go into `section`."""
    # The partition holding the same prompts: the inbox file the workload was written to.
    dagster = run_dagster(settings, DISTILL_FILE, workload.output_tokens, workload.params.seed or 0)
    engine_total = engine.wall_s + engine.warmup_s
    section["dagster_wall_s"] = round(dagster.wall_s, 2)
    section["dagster_tok_s"] = round(dagster.rows * workload.output_tokens / dagster.wall_s, 2)
    section["orchestration_overhead_s"] = round(dagster.wall_s - engine_total, 2)
    section["peak_rss_mb"] = round(max(engine.peak_rss_mb, dagster.peak_rss_mb), 1)
    return ContenderReport(
        **{
            **engine.model_dump(),
            "name": "dagster",
            "wall_s": dagster.wall_s,
            "warmup_s": 0.0,
            "gen_tok_s": section["dagster_tok_s"],
            "gen_tok_s_incl_warmup": section["dagster_tok_s"],
            "peak_rss_mb": dagster.peak_rss_mb,
        }
    )


def _run_workload(
    settings: Settings,
    target: BenchTarget,
    workload: Workload,
    options: BenchOptions,
    spec: ServerSpec,
) -> dict[str, Any]:
    requests = workload.requests
    reports: dict[str, ContenderReport] = {}
    logger.info("bench %s: %d requests", workload.name, len(requests))
    if workload.name == "distill":
        reports["naive"] = asyncio.run(run_naive(target, requests))
    reports["all_slots"] = asyncio.run(run_all_slots(target, requests))
    ledger = settings.home / f"engine-ledger-{workload.name}.sqlite3"
    ledger.unlink(missing_ok=True)
    reports["engine"] = asyncio.run(run_engine(target, requests, ledger))
    ledger.unlink(missing_ok=True)
    limit, engine = reports["all_slots"], reports["engine"]
    section: dict[str, Any] = {
        "requests": len(requests),
        "output_tokens": workload.output_tokens,
        "limit_tok_s": round(limit.gen_tok_s, 2),
        "engine_tok_s": round(engine.gen_tok_s, 2),
        "engine_tok_s_incl_warmup": round(engine.gen_tok_s_incl_warmup, 2),
        "engine_over_limit": _ratio(engine.gen_tok_s, limit.gen_tok_s),
        "engine_over_limit_incl_warmup": _ratio(engine.gen_tok_s_incl_warmup, limit.gen_tok_s),
        "limit_prompt_tokens": limit.prompt_tokens_evaluated,
        "engine_prompt_tokens": engine.prompt_tokens_evaluated,
        "prompt_tokens_ratio": _ratio(
            engine.prompt_tokens_evaluated, limit.prompt_tokens_evaluated
        ),
        "digest_reprefills": engine.digest_reprefills,
        "peak_rss_mb": round(engine.peak_rss_mb, 1),
    }
    if "naive" in reports:
        section["naive_tok_s"] = round(reports["naive"].gen_tok_s, 2)
        section["engine_over_naive"] = _ratio(engine.gen_tok_s, reports["naive"].gen_tok_s)
    section.update(_plan_check(target, workload, engine))
    if workload.name == "distill" and options.dagster:
        reports["dagster"] = _dagster_contender(settings, workload, engine, section)
    if options.ceiling:
        prompt = target.digest_tokens + round(asyncio.run(_user_tokens(target, workload)))
        ceiling = _ceiling(
            settings, target, prompt, workload.output_tokens, spec, options.tool_args
        )
        section["ceiling"] = ceiling
        section["ceiling_tok_s"] = round(ceiling["gen_tok_s"], 2)
        section["engine_over_ceiling"] = _ratio(engine.gen_tok_s, ceiling["gen_tok_s"])
    section["contenders"] = {name: report.model_dump() for name, report in reports.items()}
    return section


def run_bench(settings: Settings, options: BenchOptions) -> dict[str, Any]:
    """Spawn the bench server, run the workloads, stop it; returns the JSON document.

    SIGTERM and SIGHUP end the bench like Ctrl-C: its server and daemon are stopped on the way out.
    """
    with signals_as_exit():
        return _run_bench(settings, options)


def _run_bench(settings: Settings, options: BenchOptions) -> dict[str, Any]:
    if options.workloads == ("rehearsal",):  # the stand-in only: no llama-server
        started = time.perf_counter()
        section = run_rehearsal(settings, options.rehearsal, settings.paths.bench_dir)
        config = {"wall_s": round(time.perf_counter() - started, 1), "cpus": os.cpu_count()}
        return {"rehearsal": section, "config": config}
    if options.workloads == ("api-prompts",):  # one Batch API batch, on a server of its own
        section = api_prompts_alone(
            bench_settings(settings), lines=options.api_lines, max_tokens=options.api_output_tokens
        )
        return {"api_prompts": section, "config": {"cpus": os.cpu_count()}}
    # The night's runs take the assets' default configs, so a request's max_tokens is not the
    # server's --n-predict (llama-server lets max_tokens exceed it): the distillation's budget is
    # the night's n_predict (the runs' KIMI_BATCH_LLAMA_N_PREDICT), amplification keeps its 128,
    # and without --ignore-eos answers end where the model ends them. With --ignore-eos every
    # answer ran to its budget and 12 x 4 rows took hours here.
    night = options.workloads == ("night",)
    local = bench_settings(
        settings, n_predict=options.night_output_tokens if night else None, ignore_eos=not night
    )
    if night and options.night_pinning == "both":
        return _pinning_pair(local, options)
    document, speeds = _run_all(local, options)
    if speeds is not None:  # speeds of the distill or amplify workload, the ones `plan` takes
        save_speeds(settings.paths.bench_dir, speeds)
    return document


def _pinned_cpus(settings: Settings) -> str:
    """The server's CPUs of the pinned night: KIMI_BATCH_LLAMA_CPUS, else every CPU this
    process may use but the first (on 2 cores: the server on CPU 1, the rest on CPU 0)."""
    if settings.llama_cpus:
        return settings.llama_cpus
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise BenchError("--pinning both needs two CPUs at least")
    return format_cpu_list(frozenset(cpus[1:]))


def _pinning_pair(local: Settings, options: BenchOptions) -> dict[str, Any]:
    """The night unpinned, then pinned, on the same machine minutes apart: `night` and
    `night_pinned` (the pinned server's threads fit its set)."""
    unpinned = local.model_copy(update={"llama_cpus": None})
    pinned = local.model_copy(update={"llama_cpus": _pinned_cpus(local)})
    document, _ = _run_all(unpinned, options)
    second, _ = _run_all(pinned, options, client_cpu=False)
    document["night_pinned"] = second["night"]
    document["config_pinned"] = second["config"]
    return document


def _workload(name: str, local: Settings, target: BenchTarget, options: BenchOptions) -> Workload:
    """The requests of a distill, judge or amplify workload."""
    if name in ("distill", "judge"):
        workload = distill_workload(
            local.paths.inbox_dir / DISTILL_FILE,
            rows=options.rows,
            output_tokens=options.output_tokens,
        )
        if name == "judge":
            rubric = local.judge_rubric.read_text(encoding="utf-8")
            workload = judge_workload(workload, rubric=rubric, answer_tokens=options.output_tokens)
        return workload
    return amplify_workload(
        local.home / "workloads" / "amplify.jsonl",
        seeds=options.seeds_per_slot * target.endpoint.slots,
        variants=options.variants,
        output_tokens=options.amplify_output_tokens,
    )


def _sections(
    local: Settings,
    manager: ResidentServer,
    target: BenchTarget,
    options: BenchOptions,
    client_cpu: bool,
) -> dict[str, dict[str, Any]]:
    """Every workload's figures, on the running bench server."""
    sections: dict[str, dict[str, Any]] = {}
    for name in options.workloads:
        if name == "rewrite":
            continue  # last: it restarts the server with speculation
        if name == "night":
            sections["night"] = run_night(
                local,
                target,
                partitions=options.night_partitions,
                rows=options.night_rows,
                work_dir=local.home,
                client_cpu=client_cpu,
            )
            continue
        workload = _workload(name, local, target, options)
        sections[name] = _run_workload(local, target, workload, options, manager.spec)
    if "rewrite" in options.workloads:
        workload = rewrite_workload(
            local.home / "workloads" / "rewrite.jsonl",
            rows=options.rewrite_rows,
            output_tokens=options.rewrite_output_tokens,
        )
        sections["rewrite"] = run_rewrite(
            manager,
            workload,
            digest_path=local.digest,
            spec_type=options.spec_type or local.llama_spec or DEFAULT_SPEC_TYPE,
            draft_model=local.llama_draft_model,
            work_dir=local.home,
        )
    return sections


def _document(sections: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The JSON document: the distill figures at the top level, each workload under its name."""
    document: dict[str, Any] = {}
    if "distill" in sections:
        distill = sections["distill"]
        document.update({k: v for k, v in distill.items() if k != "contenders"})
        document["distill"] = distill
    for name in ("amplify", "judge", "rewrite", "night"):
        if name in sections:
            document[name] = sections[name]
    if "judge" in sections and "distill" in sections:
        # What judging the answers adds to writing them, measured in this run (engine walls).
        document["judge"]["judge_over_answer_wall"] = _ratio(
            sections["judge"]["engine_wall_s"], sections["distill"]["engine_wall_s"]
        )
    return document


def _run_all(
    local: Settings, options: BenchOptions, *, client_cpu: bool = True
) -> tuple[dict[str, Any], Speeds | None]:
    manager = server_from_settings(local, load_timeout_s=600)
    assert isinstance(manager, ResidentServer)
    manager.stop()  # a bench server left behind by a killed run
    load_before = os.getloadavg()
    started = time.perf_counter()
    try:
        handle = manager.ensure_running()
        target = asyncio.run(bench_target(handle.base_url, handle.model, local.digest))
        sections = _sections(local, manager, target, options, client_cpu)
    finally:
        manager.stop()
    document = _document(sections)
    document["config"] = {
        "model": handle.model,
        "slots": target.endpoint.slots,
        "ctx_per_slot": target.endpoint.ctx,
        "threads": manager.spec.effective_threads()[0],
        "flash_attn": manager.spec.flash_attn,
        "llama_cpus": local.llama_cpus,
        "digest_tokens": target.digest_tokens,
        "cpus": os.cpu_count(),
        "load_avg_before": [round(x, 2) for x in load_before],
        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
        "wall_s": round(time.perf_counter() - started, 1),
        "options": options.model_dump(),
    }
    main = sections.get("distill") or sections.get("amplify")
    if main is None:
        return document, None
    engine = main["contenders"]["engine"]
    speeds = Speeds(
        prompt_tok_s=max(engine["prompt_tok_s"], 1e-6),
        gen_tok_s=max(engine["slot_gen_tok_s"], 1e-6),
        slots=target.endpoint.slots,
        source="bench",
    )
    return document, speeds
