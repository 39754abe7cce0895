"""`bench --workload night`: a whole night as the deployment runs it, and how busy the server was.

N small inbox files dated yesterday (N partitions), a fresh Dagster home with the repository's
dagster.yaml, and a real `dagster-daemon` on the repository's workspace: the nightly schedule (its
daily tick moved to the next minute, status running) asks for every partition not yet distilled
(one `nightly_job` run over all of them), the daemon queues the run and launches it with the
instance's run launcher, exactly as at 02:00. Meanwhile the bench polls the server's `/slots`;
busy = at least one slot processing. Idle gaps are attributed from the runs' event logs: before a
run's first generating step ("run_start": queue, launcher, process start, `seed_prompts`), inside a
step before its first request ("step_start": process start, digest restore), after a step's last
request ("write": Parquet, checks, Trino), inside a step between two busy stretches ("other": in
`nightly_job` a moment with every slot waiting for a partition's next stage to be planned).
Then the engine runs the same requests in one batch on the same server, the baseline.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from kimi_batch.bench.children import start_group, stop_group
from kimi_batch.bench.contenders import BenchTarget, run_engine
from kimi_batch.bench.cpu import CpuSampler, TokenRateSampler
from kimi_batch.bench.errors import BenchError
from kimi_batch.bench.workloads import FUNCTION_SPECS, write_inbox_file
from kimi_batch.engine import GenerationRequest, SamplingParams
from kimi_batch.llama import LlamaClient
from kimi_batch.settings import Settings
from kimi_batch.tasks.amplify import DEFAULT_AMPLIFY_PARAMS, Strategy, amplification_requests
from kimi_batch.tasks.distill import distillation_requests
from kimi_batch.tasks.reader import read_inbox_file

__all__ = ["BusyTimeline", "SlotPoller", "Window", "idle_by_cause", "run_night"]

POLL_S = 0.05
# The daemon and its code server start in well under this on 2 busy cores.
TICK_LEAD_S = 45.0
RUNS_TIMEOUT_S = 1800.0
# What the assets' configs default to (AmplifyConfig, DistillConfig): the baseline's requests.
_DISTILL_TEMPERATURE = 0.7
_DISTILL_SEED = 11
_REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class BusyTimeline:
    """Samples of "any slot processing" over time (monotonic seconds)."""

    samples: list[tuple[float, bool]]

    @property
    def span(self) -> tuple[float, float] | None:
        busy = [t for t, processing in self.samples if processing]
        return (busy[0], busy[-1]) if busy else None

    def busy_fraction(self) -> float:
        span = self.span
        if span is None:
            return 0.0
        inside = [p for t, p in self.samples if span[0] <= t <= span[1]]
        return sum(inside) / len(inside) if inside else 0.0

    def idle_gaps(self) -> Iterator[tuple[float, float]]:
        """(start, end) of each idle stretch between the first busy sample and the last."""
        span = self.span
        if span is None:
            return
        start: float | None = None
        for t, processing in self.samples:
            if t < span[0] or t > span[1]:
                continue
            if not processing and start is None:
                start = t
            elif processing and start is not None:
                yield start, t
                start = None


class SlotPoller:
    """Polls `/slots` in a thread until stopped; `timeline` holds what it saw."""

    def __init__(self, base_url: str, interval_s: float = POLL_S) -> None:
        self.base_url = base_url
        self.interval_s = interval_s
        self.samples: list[tuple[float, bool]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="slot-poller", daemon=True)

    def __enter__(self) -> SlotPoller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    @property
    def timeline(self) -> BusyTimeline:
        return BusyTimeline(list(self.samples))

    def _poll(self) -> None:
        with httpx.Client(base_url=self.base_url, timeout=5.0) as client:
            while not self._stop.is_set():
                try:
                    slots = client.get("/slots").json()
                    busy = any(bool(slot.get("is_processing")) for slot in slots)
                    self.samples.append((time.monotonic(), busy))
                except (httpx.HTTPError, ValueError):
                    pass
                self._stop.wait(self.interval_s)


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
    return env


def _start_daemon(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    bin_dir = Path(sys.executable).parent
    subprocess.run(
        [str(bin_dir / "dagster"), "instance", "migrate"],
        env=env,
        cwd=_REPO,
        check=True,
        capture_output=True,
        timeout=300,
    )
    # Its code server and run workers share its process group: stop_group ends them all.
    return start_group(
        [str(bin_dir / "dagster-daemon"), "run", "-w", str(_REPO / "workspace.yaml")],
        env=env,
        cwd=_REPO,
        log=log,
    )


@dataclass(frozen=True)
class Window:
    run_id: str
    kind: str  # "run" or a step key
    start: float
    end: float


def _windows(instance: Any, run_ids: Sequence[str], offset: float) -> list[Window]:
    """Run and step spans from the event logs, on the poller's monotonic clock."""
    import dagster as dg

    windows: list[Window] = []
    for run_id in run_ids:
        records = instance.all_logs(run_id)
        # From RUN_START (the run's process is up) on: a run is in the log from when it was
        # queued, and the night queues all its runs at once.
        started = [
            r.timestamp - offset
            for r in records
            if r.dagster_event is not None
            and r.dagster_event.event_type == dg.DagsterEventType.RUN_START
        ]
        if not started:
            continue
        windows.append(
            Window(run_id, "run", min(started), max(r.timestamp for r in records) - offset)
        )
        starts: dict[str, float] = {}
        for record in records:
            event = record.dagster_event
            if event is None or event.step_key is None:
                continue
            if event.event_type == dg.DagsterEventType.STEP_START:
                starts[event.step_key] = float(record.timestamp) - offset
            elif event.event_type in (
                dg.DagsterEventType.STEP_SUCCESS,
                dg.DagsterEventType.STEP_FAILURE,
            ):
                ended = float(record.timestamp) - offset
                begun = starts.get(event.step_key, ended)
                windows.append(Window(run_id, event.step_key, begun, ended))
    return windows


def _cause(gap: tuple[float, float], windows: Sequence[Window], timeline: BusyTimeline) -> str:
    """Why the server idled: where the gap's middle falls among the runs' and steps' spans."""
    from kimi_batch.defs.jobs import NIGHTLY_OP_NAME
    from kimi_batch.defs.stages import nightly_stages

    # The per-partition jobs' generating steps, and the nightly job's one step.
    generating = {*(d.asset for d in nightly_stages()), NIGHTLY_OP_NAME}
    middle = (gap[0] + gap[1]) / 2
    for window in windows:
        if window.kind in generating and window.start <= middle <= window.end:
            busy_before = any(p for t, p in timeline.samples if window.start <= t < gap[0])
            busy_after = any(p for t, p in timeline.samples if gap[1] <= t <= window.end)
            if not busy_before:
                return "step_start"
            return "other" if busy_after else "write"
    run = next((w for w in windows if w.kind == "run" and w.start <= middle <= w.end), None)
    if run is None:
        return "run_start"  # between runs: the queue, the launcher, the run's process
    first_generating = min(
        (w.start for w in windows if w.run_id == run.run_id and w.kind in generating),
        default=run.end,
    )
    # Inside a run before its first generating step: its process, `seed_prompts`. After it:
    # between two steps, the next step's start (its process, with the multiprocess executor).
    return "run_start" if middle < first_generating else "step_start"


def idle_by_cause(timeline: BusyTimeline, windows: Sequence[Window]) -> dict[str, float]:
    """Seconds of idle server between the first request and the last, by cause."""
    idle: dict[str, float] = {"run_start": 0.0, "step_start": 0.0, "write": 0.0, "other": 0.0}
    for gap in timeline.idle_gaps():
        idle[_cause(gap, windows, timeline)] += gap[1] - gap[0]
    return idle


def run_night(
    settings: Settings,
    target: BenchTarget,
    *,
    partitions: int,
    rows: int,
    work_dir: Path,
) -> dict[str, Any]:
    """The night through the daemon, then the same requests in one engine batch."""
    import dagster as dg

    home = work_dir / "night"
    shutil.rmtree(home, ignore_errors=True)
    (home / "dagster").mkdir(parents=True)
    shutil.copy(_REPO / "dagster.yaml", home / "dagster" / "dagster.yaml")
    tick = _next_tick(settings)
    night = tick.date() - timedelta(days=1)
    files = _write_night_inbox(home / "inbox", night, partitions, rows)
    base_url = target.endpoint.base_url
    env = _daemon_env(settings, home, base_url, night - timedelta(days=1), tick)
    tokens_before = _predicted_total(base_url)
    offset = time.time() - time.monotonic()
    # The daemon starts inside the CPU sampler: its start-up and code servers are the night's.
    with CpuSampler() as night_cpu, TokenRateSampler(base_url) as rates:
        daemon = _start_daemon(env, home / "daemon.log")
        try:
            with SlotPoller(base_url) as poller:
                run_ids = _wait_for_runs(home / "dagster", daemon)
            timeline = poller.timeline
        finally:
            stop_group(daemon)
    tokens = _predicted_total(base_url) - tokens_before
    with dg.DagsterInstance.from_config(str(home / "dagster")) as instance:
        windows = _windows(instance, run_ids, offset)
        statuses = [
            run.status.value for run in instance.get_runs(dg.RunsFilter(run_ids=list(run_ids)))
        ]
    # The raw material, kept next to the figures: samples and run/step spans.
    (home / "timeline.json").write_text(
        json.dumps(
            {
                "samples": timeline.samples,
                "windows": [[w.run_id, w.kind, w.start, w.end] for w in windows],
            }
        )
    )
    span = timeline.span
    if span is None:
        raise BenchError("the night sent no request (see the daemon log)")
    wall = span[1] - span[0]
    idle = idle_by_cause(timeline, windows)
    ledger = work_dir / "night-one-batch.sqlite3"
    ledger.unlink(missing_ok=True)
    with CpuSampler() as one_batch_cpu:
        baseline = asyncio.run(
            run_engine(target, _night_requests(files, settings.llama_n_predict), ledger)
        )
    ledger.unlink(missing_ok=True)
    tok_s = tokens / wall if wall else 0.0
    return {
        "partitions": partitions,
        "rows": partitions * rows,
        "runs": len(run_ids),
        "run_statuses": {s: statuses.count(s) for s in sorted(set(statuses))},
        "busy_fraction": round(timeline.busy_fraction(), 4),
        "wall_s": round(wall, 2),
        "idle_s": {cause: round(seconds, 2) for cause, seconds in idle.items()},
        "tokens_generated": int(tokens),
        "tok_s": round(tok_s, 2),
        "engine_one_batch_tok_s": round(baseline.gen_tok_s, 2),
        "night_over_one_batch": round(tok_s / baseline.gen_tok_s, 4) if baseline.gen_tok_s else 0.0,
        "poll_interval_s": POLL_S,
        "cpu_s": night_cpu.split().as_json(),
        "one_batch_cpu_s": one_batch_cpu.split().as_json(),
        # Seconds from the first busy sample: the server's speed next to the runs' spans.
        "server_tok_s_over_time": [
            [round(t - span[0], 1), round(rate, 2)] for t, rate in rates.points
        ],
        "events": [
            [w.kind, round(w.start - span[0], 1), round(w.end - span[0], 1)] for w in windows
        ],
    }


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
