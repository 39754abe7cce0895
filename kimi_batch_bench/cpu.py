"""Where the CPU goes during a bench: seconds by process group, read from `/proc`, and the
server's own generation speed over time from its `/metrics`.

The night bench asks what the orchestration costs the model. Each process on the machine is
put in a group by its command line (`llama_server`, `run_worker`, `daemon`, `code_servers`,
`webserver`, `trino`, `bench`, `other`); a sampler thread reads every process's user+system
time every `interval_s` and keeps the last value seen per process, so a process that exits
loses at most its last interval. `machine` is the whole box's busy time from `/proc/stat` over
the same span: `machine` minus the groups' sum is what the sampler missed (processes born and
gone between two samples, such as short `dagster` CLI calls).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

__all__ = [
    "GROUPS",
    "CpuSampler",
    "CpuSplit",
    "TokenRateSampler",
    "process_group",
]

GROUPS = (
    "llama_server",
    "run_worker",
    "daemon",
    "code_servers",
    "webserver",
    "trino",
    "bench",
    "other",
)
_PROC = Path("/proc")
_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def process_group(argv: Sequence[str], *, pid: int, bench_pid: int) -> str:
    """The group a process belongs to, from its command line (`/proc/<pid>/cmdline`)."""
    if pid == bench_pid:
        return "bench"
    if not argv:
        return "other"
    program = os.path.basename(argv[0])
    words = [os.path.basename(word) for word in argv[:6]]
    if "llama-server" in program or "llama-server" in words:
        return "llama_server"
    if "dagster-daemon" in words:
        return "daemon"
    if "dagster-webserver" in words or "dagit" in words:
        return "webserver"
    joined = " ".join(argv[:8])
    if "dagster" in joined and ("api grpc" in joined or "code-server" in joined):
        return "code_servers"
    if "dagster" in joined and ("execute_run" in joined or "execute_step" in joined):
        return "run_worker"
    if program == "java" and any("trino" in word for word in argv):
        return "trino"
    return "other"


def _argv(pid: int) -> list[str]:
    raw = (_PROC / str(pid) / "cmdline").read_bytes()
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _cpu_ticks(pid: int) -> tuple[int, int, int]:
    """(start time, utime + stime, parent pid); the start time tells a reused pid apart."""
    stat = (_PROC / str(pid) / "stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # the command name may hold spaces
    return int(fields[19]), int(fields[11]) + int(fields[12]), int(fields[1])


# A process of no group of its own belongs to its parent's when the parent is one of these: a
# code server starts each run's worker as a `multiprocessing` child (its command line names no
# dagster), the daemon's helpers are the daemon's. A child still showing its parent's own command
# line (forked, not yet or never exec'd) is the parent's child too, not a second code server. The
# group is decided again whenever a process's command line changes (an exec), so a child first
# seen between fork and exec gets the group of the program it became (outside `_SETTLED`).
_INHERITED = {"code_servers": "run_worker", "run_worker": "run_worker", "daemon": "daemon"}


# Groups no exec moves a process out of in practice: their command lines are not read again
# (llama-server's and Trino's are the processes with the largest memory maps).
_SETTLED = frozenset({"llama_server", "trino", "webserver", "daemon", "bench"})


def _machine_busy_ticks() -> int:
    """Busy clock ticks of all CPUs together (every `/proc/stat` column but idle and iowait)."""
    first = (_PROC / "stat").read_text().splitlines()[0].split()[1:]
    values = [int(value) for value in first[:8]]
    return sum(values) - values[3] - values[4]


@dataclass(frozen=True)
class CpuSplit:
    """CPU seconds by group over one sampled span, and the whole machine's for comparison."""

    by_group: dict[str, float]
    machine_s: float
    wall_s: float

    def as_json(self) -> dict[str, float]:
        """The `cpu_s` figures: every group (rounded), `machine`, and the span's `wall`."""
        figures = {group: round(self.by_group.get(group, 0.0), 2) for group in GROUPS}
        return figures | {"machine": round(self.machine_s, 2), "wall": round(self.wall_s, 2)}


class _Background:
    """A daemon thread running `loop(stop)` between `start()` and `stop()`."""

    def __init__(self, loop: Callable[[threading.Event], None], name: str) -> None:
        self._event = threading.Event()
        self._thread = threading.Thread(target=loop, args=(self._event,), name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._event.set()
        self._thread.join(10)


@dataclass
class _Seen:
    group: str
    first: int
    last: int
    argv: tuple[str, ...] = ()


@dataclass
class CpuSampler:
    """Samples every process's CPU time in a thread while entered; `split()` after the exit.

    A process already running at the start counts only what it used after it (its first
    sample is its baseline); one born later counts from zero.
    """

    interval_s: float = 0.5
    _seen: dict[tuple[int, int], _Seen] = field(default_factory=dict)
    _by_pid: dict[int, _Seen] = field(default_factory=dict)  # the newest process of each pid
    _thread: _Background | None = None
    _started: tuple[float, int] = (0.0, 0)
    _ended: tuple[float, int] = (0.0, 0)
    _first_pass: bool = True

    def __enter__(self) -> CpuSampler:
        self._started = (time.monotonic(), _machine_busy_ticks())
        self.sample()
        self._first_pass = False
        self._thread = _Background(self._run, "cpu-sampler")
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:
            self._thread.stop()
        self.sample()
        self._ended = (time.monotonic(), _machine_busy_ticks())

    def _run(self, stop: threading.Event) -> None:
        while not stop.wait(self.interval_s):
            self.sample()

    def sample(self) -> None:
        """One pass over `/proc` (processes that vanish mid-read are skipped)."""
        bench_pid = os.getpid()
        for entry in _PROC.iterdir():
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            try:
                start, ticks, parent = _cpu_ticks(pid)
                key = (pid, start)
                seen = self._seen.get(key)
                if seen is not None and seen.group in _SETTLED:
                    seen.last = ticks
                    continue  # (reading a command line waits on the process's memory map lock)
                # Read before a new process is recorded: one gone by now is never left groupless.
                argv = tuple(_argv(pid))
                if seen is None:
                    baseline = ticks if self._first_pass else 0
                    seen = _Seen(group="", first=baseline, last=ticks)
                    self._seen[key] = self._by_pid[pid] = seen
                seen.last = ticks
                # An exited process's command line reads empty: it keeps the group it had.
                if not seen.group or (argv and argv != seen.argv):
                    group = process_group(argv, pid=pid, bench_pid=bench_pid)
                    seen.group = self._inherited_group(group, argv, parent)
                    seen.argv = argv
            except (OSError, ValueError, IndexError):
                continue

    def _inherited_group(self, group: str, argv: tuple[str, ...], parent: int) -> str:
        """`group`, or the one a child of `parent` inherits (see `_INHERITED`)."""
        parent_seen = self._newest(parent)
        if parent_seen is None or parent_seen.group not in _INHERITED:
            return group
        if group == "other" or argv == parent_seen.argv:
            return _INHERITED[parent_seen.group]
        return group

    def _newest(self, pid: int) -> _Seen | None:
        return self._by_pid.get(pid)

    def process(self, pid: int) -> tuple[str, float] | None:
        """(group, CPU seconds counted) of the newest process seen with `pid`, if any."""
        item = self._newest(pid)
        return None if item is None else (item.group, (item.last - item.first) / _TICKS_PER_S)

    def split(self) -> CpuSplit:
        by_group: dict[str, float] = {}
        for seen in self._seen.values():
            seconds = (seen.last - seen.first) / _TICKS_PER_S
            by_group[seen.group] = by_group.get(seen.group, 0.0) + seconds
        machine = (self._ended[1] - self._started[1]) / _TICKS_PER_S
        return CpuSplit(
            by_group=by_group, machine_s=machine, wall_s=self._ended[0] - self._started[0]
        )


@dataclass
class TokenRateSampler:
    """The server's generated tok/s over time, from `llamacpp:tokens_predicted_total` in its
    `/metrics` (llama-server's `--metrics`), one point per `interval_s`."""

    base_url: str
    interval_s: float = 2.0
    points: list[tuple[float, float]] = field(default_factory=list)
    _thread: _Background | None = None

    def __enter__(self) -> TokenRateSampler:
        self._thread = _Background(self._run, "tok-rate-sampler")
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:
            self._thread.stop()

    def _run(self, stop: threading.Event) -> None:
        previous: tuple[float, float] | None = None
        with httpx.Client(base_url=self.base_url, timeout=5.0) as client:
            while True:
                now, total = time.monotonic(), _predicted_total(client)
                if total is not None:
                    if previous is not None and now > previous[0]:
                        rate = (total - previous[1]) / (now - previous[0])
                        self.points.append((now, max(rate, 0.0)))
                    previous = (now, total)
                if stop.wait(self.interval_s):
                    return


def _predicted_total(client: httpx.Client) -> float | None:
    """The counter's value, None when the server does not answer or has no metrics."""
    try:
        text = client.get("/metrics").text
    except httpx.HTTPError:
        return None
    for line in text.splitlines():
        if line.startswith("llamacpp:tokens_predicted_total"):
            try:
                return float(line.split()[-1])
            except ValueError:
                return None
    return None
