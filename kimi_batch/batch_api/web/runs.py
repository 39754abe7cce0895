"""Who runs the API's batches: a Dagster daemon serving the instance, else `kimi-batch api` itself.

With a daemon (its sensor heartbeat is fresh) the API batch sensor starts each batch's run, as
in a deployment. Without one, `BatchRuns` does the sensor's work from a background thread of the
API process: the same decision (`batches_needing_runs`, the one place that picks the batches)
and, for each batch, the same job on the same partition with the same tags, executed through the
instance by `dg.execute_job` in a child process of its own session (so the run's worker is a
process like the daemon's, survives a Ctrl-C of the API, and the UI shows the run when one is
opened later). Runs it starts bypass the run queue: one at a time, so two never compete for the
server's slots. With `--no-launch` and no daemon, a batch waiting over a minute gets an error
entry saying why, instead of staying `validating` in silence.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time
from enum import StrEnum
from pathlib import Path

import dagster as dg

from kimi_batch.batch_api import (
    ApiStore,
    BatchLineError,
    BatchRecord,
    process_running,
    process_token,
)
from kimi_batch.cli.demo import demo_instance
from kimi_batch.defs.api_sensor import batches_needing_runs, missing_batch_partitions
from kimi_batch.defs.assets.api_batch import API_TRIGGER_TAG
from kimi_batch.defs.jobs import API_BATCH_JOB_NAME
from kimi_batch.defs.partitions import api_batch_partitions
from kimi_batch.settings import Settings

_log = logging.getLogger(__name__)
# The daemon beats every 30 s (Dagster's interval); two missed beats and it is gone. Dagster's own
# status page tolerates 30 minutes, far too long for a client polling its batch.
DAEMON_FRESH_S = 75.0
# The daemon thread whose heartbeat says that the API batch sensor is evaluated.
SENSOR_DAEMON = "SENSOR"
# A batch waiting this long for a run with nobody to start one gets an error entry.
WAIT_BEFORE_ERROR_S = 60.0
NO_RUNNER_CODE = "no_run_launcher"
# A batch whose run could not even be created this many times (the child died before it) fails to
# start here: it gets an error entry and waits for a daemon, instead of a start every tick.
MAX_LAUNCHES = 3
LAUNCH_FAILED_CODE = "run_launch_failed"
# On the runs this process starts: who started them (the UI shows the tag).
LAUNCHED_BY_TAG = "kimi_batch/launched_by"
LAUNCHED_BY = "kimi-batch api"
# On the same runs: the child process executing it, as `host:process_token`.
RUN_WORKER_TAG = "kimi_batch/run_worker"
_UNFINISHED = [
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
]


class RunMode(StrEnum):
    """Who starts the batches' runs."""

    DAEMON = "daemon"  # a Dagster daemon serves the instance: its sensor does
    OWN = "own"  # this process does
    NONE = "none"  # nobody (--no-launch and no daemon): waiting batches get an error entry


def daemon_serving(instance: dg.DagsterInstance, now: float | None = None) -> bool:
    """True when a Dagster daemon evaluating sensors has beaten recently on `instance`."""
    beat = instance.get_daemon_heartbeats().get(SENSOR_DAEMON)
    return beat is not None and (now or time.time()) - beat.timestamp <= DAEMON_FRESH_S


def api_batch_job_definition() -> dg.JobDefinition:
    """`api_batch_job` of the code location this environment configures (for `execute_job`)."""
    from kimi_batch.definitions import build_definitions

    return build_definitions(Settings.from_env()).resolve_job_def(API_BATCH_JOB_NAME)


def execute_batch_run(batch_id: str) -> None:
    """In the child process: the batch's run, in its partition, on the instance of DAGSTER_HOME."""
    with dg.DagsterInstance.get() as instance:
        dg.execute_job(
            dg.reconstructable(api_batch_job_definition),
            instance,
            tags={
                "dagster/partition": batch_id,
                API_TRIGGER_TAG: batch_id,
                LAUNCHED_BY_TAG: LAUNCHED_BY,
                RUN_WORKER_TAG: f"{socket.gethostname()}:{process_token()}",
            },
            raise_on_error=False,
        )


class BatchRuns:
    """The API process's run launcher: a thread that ticks every `api_sensor_interval_s`."""

    def __init__(self, settings: Settings, *, launch: bool = True) -> None:
        self.settings = settings
        self.launch = launch
        self.instance = demo_instance(settings)
        self._child: tuple[str, subprocess.Popen[bytes]] | None = None
        self._launches: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="batch-runs", daemon=True)

    def mode(self) -> RunMode:
        if daemon_serving(self.instance):
            return RunMode.DAEMON
        return RunMode.OWN if self.launch else RunMode.NONE

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop ticking; a run already started goes on in its own process."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:  # one bad tick (a locked database) must not end the launcher
                _log.exception("kimi-batch api: starting batch runs failed; retrying")
            self._stop.wait(self.settings.api_sensor_interval_s)

    def tick(self) -> RunMode:
        """One pass: leave the batches to the daemon, start the next one's run, or flag them."""
        self.end_dead_runs()
        mode = self.mode()
        if mode is RunMode.DAEMON or self._running():
            return mode
        waiting = batches_needing_runs(self.settings, self.instance, _log)
        if mode is RunMode.NONE:
            self._flag_unserved(waiting)
            return mode
        startable = [b for b in waiting if self._launches.get(b.id, 0) < MAX_LAUNCHES]
        if startable:
            self._start(startable[0])
        for batch in waiting:
            if self._launches.get(batch.id, 0) >= MAX_LAUNCHES:
                self._flag(batch, _launch_failed_error(self))
        return mode

    def end_dead_runs(self) -> list[str]:
        """End the unfinished runs whose worker, a child this host started, is gone (killed,
        out of memory): failed, or cancelled if a cancel was under way; their pool slots freed.
        With no daemon nothing else would (run monitoring is the daemon's), and the batch
        would stay in_progress and the next run wait for the slot. The run ids ended."""
        ended: list[str] = []
        launched = dg.RunsFilter(tags={LAUNCHED_BY_TAG: LAUNCHED_BY}, statuses=_UNFINISHED)
        for run in self.instance.get_runs(filters=launched):
            host, _, worker = run.tags.get(RUN_WORKER_TAG, "").rpartition(":")
            if host != socket.gethostname() or not worker or process_running(worker):
                continue
            message = f"its run worker (pid {worker.partition('.')[0]}) ended mid-run"
            if run.status is dg.DagsterRunStatus.CANCELING:
                self.instance.report_run_canceled(run, message=message)
            else:
                self.instance.report_run_failed(run, message=message)
            storage = self.instance.event_log_storage
            if storage.supports_global_concurrency_limits:
                storage.free_concurrency_slots_for_run(run.run_id)
            _log.warning(f"run {run.run_id}: {message}; ended")
            ended.append(run.run_id)
        return ended

    def _running(self) -> bool:
        """True while the run this process started last is still being created or executed."""
        if self._child is None:
            return False
        if self._child[1].poll() is None:
            return True
        self._child = None
        return False

    def _start(self, batch: BatchRecord) -> None:
        new = missing_batch_partitions(self.instance, [batch])
        if new:
            self.instance.add_dynamic_partitions(api_batch_partitions.name or "", new)
        env = {**os.environ, "DAGSTER_HOME": str(self.instance.root_directory)}
        code = f"from kimi_batch.batch_api.web.runs import execute_batch_run; execute_batch_run({batch.id!r})"
        # The run's own log is in the instance; this file keeps what a child that died before
        # creating its run printed. Its own session: a Ctrl-C of the API does not stop a run.
        log = Path(self.instance.root_directory) / "kimi-batch-api-runs.log"
        with log.open("ab") as sink:
            process = subprocess.Popen(
                [sys.executable, "-c", code],
                env=env,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._child = (batch.id, process)
        self._launches[batch.id] = self._launches.get(batch.id, 0) + 1
        _log.warning(f"{batch.id}: no Dagster daemon; its run started here (pid {process.pid})")

    def _flag_unserved(self, waiting: list[BatchRecord]) -> None:
        now = time.time()
        for batch in waiting:
            if now - batch.created_at >= WAIT_BEFORE_ERROR_S:
                self._flag(batch, _no_runner_error(self))

    def _flag(self, batch: BatchRecord, error: BatchLineError) -> None:
        """Add `error` to the batch's errors, once."""
        if any(known.code == error.code for known in batch.errors):
            return
        with ApiStore(self.settings.paths) as store:
            # update_batch's own crash point (api.batch_updated) marks this write for the sweep.
            store.update_batch(batch.id, errors=[*batch.errors, error])


def _no_runner_error(runs: BatchRuns) -> BatchLineError:
    return BatchLineError(
        code=NO_RUNNER_CODE,
        message=(
            "waiting for a run: no Dagster daemon serves the instance at "
            f"{runs.instance.root_directory} and kimi-batch api was started with --no-launch; "
            "start one (make dev, or dagster-daemon run -w workspace.yaml with that DAGSTER_HOME) "
            "or restart kimi-batch api without --no-launch"
        ),
    )


def _launch_failed_error(runs: BatchRuns) -> BatchLineError:
    log = Path(runs.instance.root_directory) / "kimi-batch-api-runs.log"
    return BatchLineError(
        code=LAUNCH_FAILED_CODE,
        message=(
            f"its run failed to start {MAX_LAUNCHES} times (see {log}); it waits for a Dagster "
            "daemon (make dev) or a restart of kimi-batch api"
        ),
    )
