"""`bench --workload rehearsal`: nights on the time-scaled stand-in of the target, against `plan`.

R rows over P inbox files (P partitions of one day) are distilled through the nightly schedule:
the schedule is evaluated on a real Dagster instance and its one run request is executed as the
daemon would launch it (`nightly_job` in this process, its run config and tags plus the window's
tag) against the stand-in (`standin.py`, Kimi-K2.5 on the 16-core EPYC at `time_scale` x speed).
The nightly window is the target's `window_h` hours divided by the time scale. The run holds
every partition's lease, lands each one's seeds, then sends all their rows as one engine batch;
past the window it dispatches no more, lands the partitions whose rows are all done and fails
naming the others ("resume next night"); the next night's evaluation asks for those, and their
finished rows come from the ledger. Amplification is the day's work (the inbox sensor's ingest
job): the night skips every stage but distillation (`skip_stages`), so a row is one teacher
answer.

Reported: rows done when the window closed and the next night's catch-up, against `plan`'s
prediction of both with the target's speed model (`speed_model`, the one the stand-in runs on:
decode slowing as the context grows, slots sharing a step), the rows' shape (digest tokens
cached before each prompt, the evaluated prompt, the answer) and each night's measured server
idle: per partition (the op's start to its last seeds landed, over the partitions) and once a
night (the rest of the idle inside the window: the run's start, planning the stage, the engine's
turnaround between rounds), in target seconds; `plan` with the flat per-slot speeds the rows
measured (as `bench` measures them) beside it; and the server-busy fraction, both at the
stand-in's pace (where orchestration is `time_scale` times too expensive) and at the target's
(busy target seconds against busy target seconds plus idle wall seconds: orchestration costs
the same seconds there).
"""

from __future__ import annotations

import shutil
import time
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.engine import Ledger
from kimi_batch.settings import Settings
from kimi_batch_bench.busy import SlotPoller
from kimi_batch_bench.plan import PlanInput, PlanResult, plan_partition
from kimi_batch_bench.ports import free_port
from kimi_batch_bench.standin import StandinServer
from kimi_batch_bench.workloads import FUNCTION_SPECS, write_inbox_file

__all__ = ["RehearsalOptions", "run_rehearsal"]


class RehearsalOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    rows: int = Field(default=10_000, ge=1)
    partitions: int = Field(default=40, ge=1)
    time_scale: float = Field(default=600.0, gt=0)
    window_h: float = Field(default=5.0, gt=0, description="The target's nightly window.")
    slots: int = Field(default=4, ge=1)
    ctx: int = Field(default=16384, ge=1024, description="Total context of the stand-in.")
    output_tokens: int = Field(default=256, ge=1, description="Answer length (max_tokens).")
    nights: int = Field(default=2, ge=1, description="Nights rehearsed (the first + catch-up).")
    digest_repeat: int = Field(
        default=1, ge=1, description="The digest's text this many times over: a longer context."
    )


def _rehearsal_settings(
    settings: Settings, home: Path, base_url: str, start: date, digest_repeat: int
) -> Settings:
    """A fresh deployment on `home` attached to the stand-in: only the digest (repeated
    `digest_repeat` times) and the timezone of `settings` carry over (its server, warehouse,
    Trino and schedule would change the nights).
    """
    digest = settings.digest
    if digest_repeat > 1:
        digest = home / "digest.md"
        digest.write_text("\n\n".join([settings.digest.read_text()] * digest_repeat))
    return Settings(
        home=home,
        model=None,
        llama_server=None,
        llama_url=base_url,
        digest=digest,
        timezone=settings.timezone,
        partitions_start=start,
    )


def _write_inbox(folder: Path, rows: int, partitions: int) -> None:
    per = [rows // partitions + (1 if p < rows % partitions else 0) for p in range(partitions)]
    index = 0
    for p, count in enumerate(per):
        prompts = []
        for _ in range(count):
            signature, task = FUNCTION_SPECS[index % len(FUNCTION_SPECS)]
            prompts.append(f"Write a Python function `{signature}` that returns {task}. (#{index})")
            index += 1
        write_inbox_file(folder / f"rehearsal-{p + 1:03d}.jsonl", prompts)


class _Night(BaseModel):
    rows_done: int
    runs: int = Field(description="Runs the schedule asked for: one a night.")
    runs_failed: int
    stopped_at_window: bool = Field(description="The run carries the window's stop tag.")
    partitions: list[str] = Field(description="The partitions the night's run was asked for.")
    partitions_left: list[str] = Field(description="Of these, those not distilled after it.")
    wall_s: float
    busy_fraction: float
    busy_target_s: float
    idle_s: float
    lead_in_s: float = Field(description="Server idle from the run's start to its first request.")
    seeds_s: float = Field(description="Of the lead-in, the op's start to its last seeds landed.")
    gaps_s: float = Field(description="Server idle inside the window after the first request.")
    night_overhead_s: float = Field(description="Lead-in and gaps less the partitions' share.")
    partition_overhead_s: float = Field(description="Seeds landed (and lease) per partition.")


def _nights_request(
    settings: Settings, instance: Any, scheduled: datetime, options: RehearsalOptions
) -> tuple[Any, dict[str, Any], list[str]]:
    """The schedule's one `nightly_job` request for `scheduled`, its run config made
    distillation-only, and the partitions it asks for."""
    import dagster as dg

    from kimi_batch.defs.jobs import NIGHTLY_JOB_NAME, NIGHTLY_OP_NAME
    from kimi_batch.defs.schedules import build_nightly_schedule
    from kimi_batch.pipeline import DISTILL
    from kimi_batch_bench.stages import night_stage_assets

    # Closed at once: the context opens an instance of its own (Dagster's defs-state storage
    # is a context variable until then), which must not outlive the tick.
    with dg.build_schedule_context(
        instance=instance, scheduled_execution_time=scheduled
    ) as context:
        request = build_nightly_schedule(settings)(context)
    # One run a night for the night's job: anything else is the rehearsal of something else.
    assert isinstance(request, dg.RunRequest), request
    assert request.job_name == NIGHTLY_JOB_NAME, request.job_name
    config = request.run_config["ops"][NIGHTLY_OP_NAME]["config"]
    # Amplification is the day's ingest job, not the night's: distil the seeds only.
    night_config = {
        **config,
        "skip_stages": [asset for asset in night_stage_assets() if asset != DISTILL.asset],
        DISTILL.config_field: {"max_tokens": options.output_tokens},
    }
    run_config = {"ops": {NIGHTLY_OP_NAME: {"config": night_config}}}
    return request, run_config, list(config["partitions"])


def _night(
    settings: Settings,
    instance: Any,
    scheduled: datetime,
    window_real_s: float,
    options: RehearsalOptions,
    server: StandinServer,
    ledger_path: Path,
) -> _Night:
    """One night: evaluate the schedule and execute its one `nightly_job` run as the daemon
    would launch it (its run config and tags, plus the window's tag), distillation only."""

    from kimi_batch.definitions import build_definitions
    from kimi_batch.defs.jobs import DISTILLED_RESPONSES, NIGHTLY_JOB_NAME, STOPPED_TAG, WINDOW_TAG

    request, night_config, partitions = _nights_request(settings, instance, scheduled, options)
    job = build_definitions(settings).resolve_job_def(NIGHTLY_JOB_NAME)
    done_before = _ledger_rows(ledger_path)
    sim = server.sim
    assert sim is not None
    busy_before = sim.busy_target_s
    window_ends = datetime.now(scheduled.tzinfo) + timedelta(seconds=window_real_s)
    started = time.monotonic()
    window_closes = started + window_real_s
    with SlotPoller(server.base_url, interval_s=0.02) as poller:
        result = job.execute_in_process(
            instance=instance,
            run_config=night_config,
            tags={**request.tags, WINDOW_TAG: window_ends.isoformat()},
            raise_on_error=False,
        )
    ended = time.monotonic()
    samples = list(poller.samples)
    first_busy = next((t for t, busy in samples if busy and t >= started), ended)
    lead_in = _idle_s(samples, started, min(first_busy, window_closes))
    inside = _idle_s(samples, started, min(ended, window_closes))
    step_start, last_seeds = _seed_span(instance, result.run_id)
    seeds = max(last_seeds - step_start, 0.0)
    per_partition = min(seeds, lead_in) / len(partitions) if partitions else 0.0
    run = instance.get_run_by_id(result.run_id)
    distilled = {str(key) for key in instance.get_materialized_partitions(DISTILLED_RESPONSES)}
    busy_target = sim.busy_target_s - busy_before
    wall = ended - started
    return _Night(
        rows_done=_ledger_rows(ledger_path) - done_before,
        runs=1,
        runs_failed=0 if result.success else 1,
        stopped_at_window=run is not None and run.tags.get(STOPPED_TAG) == "true",
        partitions=partitions,
        partitions_left=[key for key in partitions if key not in distilled],
        wall_s=wall,
        busy_fraction=poller.timeline.busy_fraction(),
        busy_target_s=busy_target,
        idle_s=max(wall - busy_target / options.time_scale, 0.0),
        lead_in_s=lead_in,
        seeds_s=seeds,
        gaps_s=inside - lead_in,
        night_overhead_s=inside - per_partition * len(partitions),
        partition_overhead_s=per_partition,
    )


def _seed_span(instance: Any, run_id: str) -> tuple[float, float]:
    """Wall-clock times of the night op's start and of its last `seed_prompts` landed."""
    import dagster as dg

    from kimi_batch.defs.jobs import SEED_PROMPTS

    logs = instance.all_logs(
        run_id, of_type={dg.DagsterEventType.STEP_START, dg.DagsterEventType.ASSET_MATERIALIZATION}
    )
    start = next(
        (e.timestamp for e in logs if e.dagster_event_type == dg.DagsterEventType.STEP_START), 0.0
    )
    seeds = [
        e.timestamp
        for e in logs
        if e.dagster_event_type == dg.DagsterEventType.ASSET_MATERIALIZATION
        and e.asset_materialization is not None
        and e.asset_materialization.asset_key == SEED_PROMPTS
    ]
    return start, max(seeds, default=start)


def _idle_s(samples: list[tuple[float, bool]], start: float, end: float) -> float:
    """Seconds in [start, end] the poller saw no slot processing: a run's server idle, up to the
    window's close (a run the window cuts idles on after it, waiting for nothing)."""
    idle, previous = 0.0, start
    for t, processing in list(samples):
        if t <= start:
            continue
        if t > end:
            break
        if not processing:
            idle += t - previous
        previous = t
    return idle


def _ledger_rows(path: Path) -> int:
    if not path.exists():
        return 0
    with Ledger(path) as ledger:
        return ledger.count()


def run_rehearsal(settings: Settings, options: RehearsalOptions, work_dir: Path) -> dict[str, Any]:
    """The nights on a fresh state dir and a fresh stand-in; returns the `rehearsal` figures."""
    import dagster as dg

    home = work_dir / "rehearsal"
    shutil.rmtree(home, ignore_errors=True)
    zone = settings.zone
    first = datetime.now(zone) + timedelta(days=1)  # its night is today
    today = (first - timedelta(days=1)).date().isoformat()
    _write_inbox(home / "inbox" / today, options.rows, options.partitions)
    window_real_s = options.window_h * 3600 / options.time_scale
    nights: list[_Night] = []
    started = time.monotonic()
    with StandinServer(
        port=free_port(),
        slots=options.slots,
        ctx=options.ctx,
        n_predict=max(1024, options.output_tokens),
        time_scale=options.time_scale,
    ) as server:
        start = date.fromisoformat(today)
        local = _rehearsal_settings(settings, home, server.base_url, start, options.digest_repeat)
        with dg.instance_for_test() as instance:
            ledger_path = local.paths.ledger_dir / "ledger.sqlite3"
            for night in range(options.nights):
                scheduled = first + timedelta(days=night)
                nights.append(
                    _night(local, instance, scheduled, window_real_s, options, server, ledger_path)
                )
    wall = time.monotonic() - started
    return _figures(options, nights, wall, server)


def _figures(
    options: RehearsalOptions, nights: list[_Night], wall: float, server: StandinServer
) -> dict[str, Any]:
    first = nights[0]
    second = nights[1] if len(nights) > 1 else None
    scale = options.time_scale
    # Predicted: each night with its own measured idle (at 600x one real second of Dagster is
    # ten target minutes, so the machine's jitter would otherwise decide the error, which is to
    # check the speed model and the night's shape, not that jitter).
    plan = _plan(options, server, first, target=True)
    plan_next = _plan(options, server, second, target=True) if second else plan
    measured = _plan(options, server, first, target=False)
    naive = _plan(options, server, None, target=True)
    target_busy = sum(n.busy_target_s for n in nights)
    target_idle = sum(n.idle_s for n in nights)
    return {
        "rows": options.rows,
        "partitions": options.partitions,
        "time_scale": scale,
        "window_h": options.window_h,
        "slots": options.slots,
        "output_tokens": options.output_tokens,
        "context_tokens": plan.inputs.context_tokens,
        "prompt_tokens": plan.inputs.prompt_tokens,
        "rows_done_in_window": first.rows_done,
        "plan_rows": plan.rows_in_window,
        "plan_error": _error(plan.rows_in_window, first.rows_done),
        "plan_rows_measured_speeds": measured.rows_in_window,
        "plan_rows_without_overhead": naive.rows_in_window,
        "plan_row_s": round(plan.row_s, 1),
        "measured_row_s": round(measured.row_s, 1),
        "plan_gen_tok_s": round(plan.gen_tok_s, 3),
        "measured_gen_tok_s": round(measured.gen_tok_s, 3),
        "plan_wall_h": round(plan.hours, 2),
        "plan_nights_needed": plan.nights_needed,
        "runs": [n.runs for n in nights],
        "night_overhead_s": round(first.night_overhead_s, 3),
        "partition_overhead_s": round(first.partition_overhead_s, 3),
        "next_night_rows": second.rows_done if second else 0,
        "plan_next_night_rows": plan_next.next_night_rows,
        "plan_next_night_error": _error(plan_next.next_night_rows, second.rows_done)
        if second
        else 0.0,
        "nights": [n.model_dump() for n in nights],
        "busy_fraction": round(first.busy_fraction, 4),
        "busy_fraction_at_target": round(target_busy / (target_busy + target_idle * 1.0), 4)
        if target_busy
        else 0.0,
        "wall_s": round(wall, 1),
    }


def _error(predicted: int, measured: int) -> float:
    return round((predicted - measured) / measured, 4) if measured else 0.0


def _plan(
    options: RehearsalOptions, server: StandinServer, night: _Night | None, *, target: bool
) -> PlanResult:
    """`plan` for the night: with the target's speed model (the stand-in's own, so `plan` and
    the stand-in cannot drift) and the rows' shape (tokens cached before a row's prompt, its
    evaluated prompt), or, `target=False`, with the flat per-slot speeds the rows measured (as
    `bench` measures them); both with `night`'s measured server idle, once a night and per
    partition, in target seconds (None: without)."""
    sim = server.sim
    assert sim is not None
    speeds = sim.answered.speeds()
    scale = options.time_scale
    return plan_partition(
        PlanInput(
            prompt_tokens=round(speeds.prompt_tokens_per_row),
            output_tokens=options.output_tokens,
            rows=options.rows,
            target=server.profile if target else None,
            context_tokens=round(speeds.cached_tokens_per_row),
            digest_tokens=round(speeds.cached_tokens_per_row),  # the stand-in starts cold
            prompt_tok_s=None if target else speeds.prompt_tok_s,
            gen_tok_s=None if target else speeds.gen_tok_s,
            slots=options.slots,
            window_h=options.window_h,
            partitions=options.partitions,
            night_overhead_s=max(night.night_overhead_s, 0.0) * scale if night else 0.0,
            partition_overhead_s=night.partition_overhead_s * scale if night else 0.0,
        )
    )
