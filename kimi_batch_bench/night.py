"""`bench --workload night`: a whole night as the deployment runs it, and how busy the server was.

N small inbox files dated yesterday (N partitions), a fresh Dagster home with the repository's
dagster.yaml, one long-lived code server (`workspace.code-server.yaml`, as a deployment runs it)
and a real `dagster-daemon` on it: the nightly schedule (its daily tick moved to the next minute,
status running) asks for every partition not yet distilled (one `nightly_job` run over all of
them), the daemon queues the run and launches it through the code server, exactly as at 02:00.
Meanwhile the bench polls the server's `/slots` (`busy`: busy fraction, idle stretches by cause:
before a run's first generating step "run_start", inside a step before its first request
"step_start", after a step's last request "write", between two busy stretches "other": in
`nightly_job` a moment with every slot waiting for a partition's next stage to be planned) and
samples every process's CPU time (`cpu`). Then the engine runs the same requests in one batch on
the same server, the baseline, and the client's CPU per token is measured streamed and not
(`client_cpu`).

With `KIMI_BATCH_LLAMA_CPUS` set (the bench's server pinned to that set), the bench itself, the
code server, the daemon and the run worker keep to the other CPUs, as a deployment runs them.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

from kimi_batch.engine import GenerationRequest, SamplingParams
from kimi_batch.inputs import read_inbox_file
from kimi_batch.llama import LlamaClient, format_cpu_list, server_cpus, the_rest
from kimi_batch.pipeline import (
    DEFAULT_AMPLIFY_PARAMS,
    Strategy,
    amplification_requests,
    distillation_requests,
)
from kimi_batch.settings import Settings
from kimi_batch_bench.busy import BusyTimeline, SlotPoller, idle_by_cause, run_windows
from kimi_batch_bench.children import start_group, stop_group
from kimi_batch_bench.client_cpu import client_cpu_per_token
from kimi_batch_bench.code_server import CODE_SERVER_WORKSPACE, serving_code_location
from kimi_batch_bench.contenders import BenchTarget, run_engine
from kimi_batch_bench.cpu import CpuSampler, CpuSplit, TokenRateSampler
from kimi_batch_bench.errors import BenchError
from kimi_batch_bench.workloads import FUNCTION_SPECS, write_inbox_file

__all__ = ["run_night"]

# The code server, then the daemon, start in well under this on 2 busy cores.
TICK_LEAD_S = 75.0
RUNS_TIMEOUT_S = 1800.0
# `/slots` every 0.25 s: idle stretches of a second are still seen, and the poll is cheap (every
# 50 ms the bench took about a tenth of a core, mostly polling, and the server answered it).
NIGHT_POLL_S = 0.25
# Requests of the client CPU measurement (each sent twice: streamed and not).
CLIENT_CPU_REQUESTS = 12
# What the assets' configs default to (AmplifyConfig, DistillConfig): the baseline's requests.
_DISTILL_TEMPERATURE = 0.7
_DISTILL_SEED = 11
_REPO = Path(__file__).resolve().parents[1]


def _predicted_total(base_url: str) -> float:
    async def read() -> float:
        async with LlamaClient(base_url) as client:
            return (await client.metrics()).tokens_predicted_total

    return asyncio.run(read())


def _write_night_inbox(inbox: Path, night: date, partitions: int, rows: int) -> list[Path]:
    folder = inbox / night.isoformat()
    files = []
    for p in range(partitions):
        prompts = [
            f"Write a Python function `{sig}` that returns {task}. (night {p + 1}, row {r + 1})"
            for r, (sig, task) in enumerate(
                FUNCTION_SPECS[(p * rows + r) % len(FUNCTION_SPECS)] for r in range(rows)
            )
        ]
        files.append(write_inbox_file(folder / f"night-{p + 1:02d}.jsonl", prompts))
    return files


def _night_requests(files: Sequence[Path], n_predict: int) -> list[GenerationRequest]:
    """What the night's runs send, in one list: amplification then distillation of the seeds."""
    amplify = SamplingParams(
        max_tokens=min(DEFAULT_AMPLIFY_PARAMS.max_tokens, n_predict),
        temperature=0.9,
        top_p=0.95,
        seed=7,
    )
    distill = SamplingParams(
        max_tokens=n_predict, temperature=_DISTILL_TEMPERATURE, top_p=0.95, seed=_DISTILL_SEED
    )
    requests: list[GenerationRequest] = []
    for path in files:
        seeds = read_inbox_file(path).seeds
        requests += amplification_requests(seeds, list(Strategy), 1, amplify)
        requests += distillation_requests(seeds, [], distill)
    return requests


def _next_tick(settings: Settings, lead_s: float = TICK_LEAD_S) -> datetime:
    """The first whole minute at least `lead_s` from now, in the schedule's timezone."""
    soon = datetime.now(settings.zone) + timedelta(seconds=lead_s)
    return soon.replace(second=0, microsecond=0) + timedelta(minutes=1)


def _daemon_env(
    settings: Settings, home: Path, base_url: str, start: date, tick: datetime
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KIMI_BATCH_")}
    env.update(
        {
            "KIMI_BATCH_HOME": str(home),
            "KIMI_BATCH_LLAMA_URL": base_url,
            "KIMI_BATCH_DIGEST": str(settings.digest),
            "KIMI_BATCH_TIMEZONE": settings.timezone,
            # The distillation's answer budget (DistillConfig's default is the n_predict).
            "KIMI_BATCH_LLAMA_N_PREDICT": str(settings.llama_n_predict),
            "KIMI_BATCH_PARTITIONS_START": start.isoformat(),
            # The nightly schedule as deployed, its daily tick moved to the next minute so the
            # bench need not wait for 02:00. (Not every minute: run keys are deduplicated per
            # tick, so each tick would queue the night's runs again.)
            "KIMI_BATCH_NIGHTLY_CRON": f"{tick.minute} {tick.hour} * * *",
            "KIMI_BATCH_NIGHTLY_STATUS": "running",
            "DAGSTER_HOME": str(home / "dagster"),
        }
    )
    if settings.llama_cpus:  # every process that loads the code location keeps off the server's
        env["KIMI_BATCH_LLAMA_CPUS"] = settings.llama_cpus
    return env


@contextmanager
def _kept_to(cpus: frozenset[int] | None) -> Iterator[None]:
    """This process (and what it starts meanwhile) on `cpus` while inside; None: unchanged."""
    if cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def _upgraded_instance(dagster_home: Path) -> None:
    """The instance's SQLite databases created once, in this process, before the code server
    and the daemon race to create them (what `dagster instance migrate` does, without its
    ~13 s CLI start)."""
    import dagster as dg

    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        instance.upgrade()


@contextmanager
def _night_processes(env: dict[str, str], home: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The code server, then the daemon attached to it; both process groups stopped on exit."""
    _upgraded_instance(home / "dagster")
    with serving_code_location(env, cwd=_REPO, log=home / "code_server.log") as served:
        daemon = start_group(
            [
                str(Path(sys.executable).parent / "dagster-daemon"),
                *("run", "-w", str(CODE_SERVER_WORKSPACE)),
            ],
            env=served,
            cwd=_REPO,
            log=home / "daemon.log",
        )
        try:
            yield daemon
        finally:
            stop_group(daemon)


@dataclass(frozen=True)
class _Night:
    """What the bench saw of the night's runs."""

    run_ids: list[str]
    statuses: list[str]
    timeline: BusyTimeline
    windows: list[Any]
    tokens: float
    cpu: CpuSplit
    rates: list[tuple[float, float]]


def _drive_night(home: Path, env: dict[str, str], base_url: str) -> _Night:
    """The night through the code server and the daemon, sampled from their start to its end."""
    import dagster as dg

    tokens_before = _predicted_total(base_url)
    offset = time.time() - time.monotonic()
    # Everything starts inside the CPU sampler: the processes' start-up is the night's.
    with CpuSampler() as cpu, TokenRateSampler(base_url) as rates:
        with _night_processes(env, home) as daemon, SlotPoller(base_url, NIGHT_POLL_S) as poller:
            run_ids = _wait_for_runs(home / "dagster", daemon)
        timeline = poller.timeline
    tokens = _predicted_total(base_url) - tokens_before
    with dg.DagsterInstance.from_config(str(home / "dagster")) as instance:
        windows = run_windows(instance, run_ids, offset)
        runs = instance.get_runs(dg.RunsFilter(run_ids=list(run_ids)))
        statuses = [run.status.value for run in runs]
    # The raw material, kept next to the figures: samples and run/step spans.
    (home / "timeline.json").write_text(
        json.dumps(
            {
                "samples": timeline.samples,
                "windows": [[w.run_id, w.kind, w.start, w.end] for w in windows],
            }
        )
    )
    return _Night(run_ids, statuses, timeline, windows, tokens, cpu.split(), list(rates.points))


@dataclass(frozen=True)
class _OneBatch:
    tok_s: float
    busy_fraction: float
    cpu: CpuSplit


def _one_batch(
    target: BenchTarget, requests: Sequence[GenerationRequest], ledger: Path
) -> _OneBatch:
    """The same requests in one engine batch, measured as the night is (the same samplers
    polling the server: their cost is on both sides of night / one batch)."""
    base_url = target.endpoint.base_url
    ledger.unlink(missing_ok=True)
    with (
        CpuSampler() as cpu,
        TokenRateSampler(base_url),
        SlotPoller(base_url, NIGHT_POLL_S) as poller,
    ):
        report = asyncio.run(run_engine(target, requests, ledger))
    ledger.unlink(missing_ok=True)
    return _OneBatch(report.gen_tok_s, poller.timeline.busy_fraction(), cpu.split())


def _figures(night: _Night, baseline: _OneBatch) -> dict[str, Any]:
    span = night.timeline.span
    if span is None:
        raise BenchError("the night sent no request (see the daemon log)")
    wall = span[1] - span[0]
    tok_s = night.tokens / wall if wall else 0.0
    idle = idle_by_cause(night.timeline, night.windows)
    return {
        "runs": len(night.run_ids),
        "run_statuses": {s: night.statuses.count(s) for s in sorted(set(night.statuses))},
        "busy_fraction": round(night.timeline.busy_fraction(), 4),
        "wall_s": round(wall, 2),
        "idle_s": {cause: round(seconds, 2) for cause, seconds in idle.items()},
        "tokens_generated": int(night.tokens),
        "tok_s": round(tok_s, 2),
        "engine_one_batch_tok_s": round(baseline.tok_s, 2),
        "night_over_one_batch": round(tok_s / baseline.tok_s, 4) if baseline.tok_s else 0.0,
        "engine_one_batch_busy_fraction": round(baseline.busy_fraction, 4),
        "poll_interval_s": NIGHT_POLL_S,
        "cpu_s": night.cpu.as_json(),
        "one_batch_cpu_s": baseline.cpu.as_json(),
        # Seconds from the first busy sample: the server's speed next to the runs' spans.
        "server_tok_s_over_time": [
            [round(t - span[0], 1), round(rate, 2)] for t, rate in night.rates
        ],
        "events": [
            [w.kind, round(w.start - span[0], 1), round(w.end - span[0], 1)] for w in night.windows
        ],
    }


def run_night(
    settings: Settings,
    target: BenchTarget,
    *,
    partitions: int,
    rows: int,
    work_dir: Path,
    client_cpu: bool = True,
) -> dict[str, Any]:
    """The night through the daemon, then the same requests in one engine batch (and, with
    `client_cpu`, the client's CPU per token streamed and not)."""
    home = work_dir / "night"
    shutil.rmtree(home, ignore_errors=True)
    (home / "dagster").mkdir(parents=True)
    shutil.copy(_REPO / "dagster.yaml", home / "dagster" / "dagster.yaml")
    tick = _next_tick(settings)
    night = tick.date() - timedelta(days=1)
    files = _write_night_inbox(home / "inbox", night, partitions, rows)
    base_url = target.endpoint.base_url
    env = _daemon_env(settings, home, base_url, night - timedelta(days=1), tick)
    pinned = server_cpus(settings)
    rest = the_rest(pinned) if pinned is not None else None
    requests = _night_requests(files, settings.llama_n_predict)
    with _kept_to(rest):
        seen = _drive_night(home, env, base_url)
        baseline = _one_batch(target, requests, work_dir / "night-one-batch.sqlite3")
        figures = _figures(seen, baseline)
        if client_cpu:
            distill = [r for r in requests if r.params.seed == _DISTILL_SEED]
            figures["client_cpu"] = asyncio.run(
                client_cpu_per_token(
                    base_url, distill[:CLIENT_CPU_REQUESTS], target.digest, target.endpoint.slots
                )
            )
    pinning = {
        "llama_cpus": format_cpu_list(pinned) if pinned else None,
        "other_cpus": format_cpu_list(rest) if rest else None,
    }
    return {"partitions": partitions, "rows": partitions * rows, **figures, "pinning": pinning}


def _wait_for_runs(dagster_home: Path, daemon: subprocess.Popen[bytes]) -> list[str]:
    """The nightly runs' ids once the schedule's run (or runs) have all finished."""
    import dagster as dg

    deadline = time.monotonic() + RUNS_TIMEOUT_S
    finished = {
        dg.DagsterRunStatus.SUCCESS,
        dg.DagsterRunStatus.FAILURE,
        dg.DagsterRunStatus.CANCELED,
    }
    while time.monotonic() < deadline:
        if daemon.poll() is not None:
            raise BenchError(f"dagster-daemon exited with {daemon.returncode}")
        if (dagster_home / "history").exists():
            with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
                runs = instance.get_runs(dg.RunsFilter(tags={"kimi_batch/trigger": "nightly"}))
            if runs and all(run.status in finished for run in runs):
                return [run.run_id for run in runs]
        time.sleep(2.0)
    raise BenchError(f"the night's runs did not finish within {RUNS_TIMEOUT_S:.0f} s")
