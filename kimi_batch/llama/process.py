"""The server process: its pid record, a detached spawn under the exit-recording waiter, and a
probe of its health that never retries; and how /proc shows any process (`process_stat`), which
tells a process from a later one given its pid (the pid record, lease holders, claim owners)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kimi_batch.llama.exceptions import ServerSpawnError, http_error
from kimi_batch.llama.exits import WAITER_SOURCE
from kimi_batch.llama.server_state import ServerProps
from kimi_batch.llama.urls import redact_url, url_credentials

PROBE_TIMEOUT_S = 3.0


class PidRecord(BaseModel):
    """The pid file: which process is ours (start ticks tell a reused pid apart), since when."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pid: int
    start_ticks: int
    started_at: float
    healthy_at: float | None = Field(default=None, description="When it first answered /health.")


class ProcessStat(NamedTuple):
    """A process as /proc/PID/stat shows it: its state letter (field 3) and its start time in
    clock ticks after boot (field 22), which tells it from a later process given its pid."""

    state: str
    start_ticks: int

    @property
    def exited(self) -> bool:
        """A zombie (Z: its parent has not reaped it yet) or a dead one (X) holds nothing."""
        return self.state in ("Z", "X")


def process_stat(pid: int) -> ProcessStat | None:
    """Process `pid` as /proc shows it; None when /proc shows no such process (gone, another
    user's under hidepid, no /proc)."""
    try:
        # "pid (comm) state ...": the command name may hold spaces and parentheses.
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return ProcessStat(fields[0], int(fields[19]))
    except (OSError, IndexError, ValueError):
        return None


def process_start_ticks(pid: int) -> int | None:
    """Start time of a live, non-zombie process in clock ticks; None when it is gone."""
    stat = process_stat(pid)
    return None if stat is None or stat.exited else stat.start_ticks


def running(record: PidRecord) -> bool:
    """Whether the process `record` names still runs: its pid, with its start time (a pid the
    kernel has given a later process is not ours)."""
    return process_start_ticks(record.pid) == record.start_ticks


def signal_process(record: PidRecord, sig: int) -> bool:
    """Send `sig` to the process `record` names, never to a later process given its pid; False
    when it is gone. Through a pidfd: opened first, then the start time checked, so the signal
    reaches the process that was checked (where pidfds are missing, checked just before)."""
    try:
        handle: int | None = os.pidfd_open(record.pid)
    except ProcessLookupError:
        return False
    except OSError:
        handle = None
    try:
        if not running(record):
            return False
        if handle is None:
            os.kill(record.pid, sig)
        else:
            signal.pidfd_send_signal(handle, sig)
        return True
    except ProcessLookupError:
        return False  # it ended between the check and the signal
    finally:
        if handle is not None:
            os.close(handle)


def spawn_detached(
    argv: list[str],
    env: dict[str, str],
    log_path: Path,
    exit_path: Path,
    *,
    cpus: frozenset[int] | None = None,
) -> int:
    """Start `argv` in its own session under a detached waiter that records how it ends
    (pinned to `cpus` when given).

    A direct child of a long-lived process (a test, `dagster dev`) would linger as a zombie after
    a crash and look alive; the launcher exits at once, init adopts the waiter, and the waiter
    reaps the server the moment it dies and writes its wait status to `exit_path`.
    """
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            WAITER_SOURCE,
            json.dumps(argv),
            str(log_path),
            str(exit_path),
            json.dumps(sorted(cpus or ())),
        ],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        reason = (result.stdout.strip() or result.stderr.strip()).removeprefix("error: ")
        raise ServerSpawnError(f"could not launch {argv[0]}: {reason}")
    return int(result.stdout.strip())


# A probe's body (a real /props is a few KiB, its chat template included): one past this, or
# without end, is no llama-server we can read, not a process out of memory.
PROBE_MAX_BYTES = 4 * 1024 * 1024


class _BodyTooLargeError(Exception):
    pass


def _get_capped(http: httpx.Client, path: str) -> tuple[int, bytes]:
    """GET `path`: its status and body, read as it comes up to PROBE_MAX_BYTES and within
    twice the probe's timeout in all (httpx's read timeout is per read: a trickle outlives it)."""
    deadline = time.monotonic() + 2 * PROBE_TIMEOUT_S
    with http.stream("GET", path) as response:
        body = bytearray()
        for chunk in response.iter_bytes():
            body += chunk
            if len(body) > PROBE_MAX_BYTES or time.monotonic() > deadline:
                raise _BodyTooLargeError(path)
        return response.status_code, bytes(body)


def probe(base_url: str, api_key: str | None) -> tuple[str, ServerProps | None]:
    """('down' | 'loading' | 'ok', props when ok) without retries."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    credentials = url_credentials(base_url)
    try:
        with httpx.Client(
            base_url=redact_url(base_url),
            auth=httpx.BasicAuth(*credentials) if credentials else None,
            headers=headers,
            timeout=PROBE_TIMEOUT_S,
        ) as http:
            health, _ = _get_capped(http, "/health")
            if health == 503:
                return "loading", None
            if health != 200:
                return "down", None
            props, body = _get_capped(http, "/props")
    except (httpx.HTTPError, _BodyTooLargeError):
        return "down", None
    if props in (401, 403):
        # /health is public, /props needs the key: a healthy server that refuses it is one
        # whose key we lack, never a server with a default model and one slot.
        raise http_error(
            props,
            "the server refuses its /props: check KIMI_BATCH_LLAMA_API_KEY",
            url=redact_url(base_url),
        )
    if props != 200:
        return "down", None  # answers /health but is no llama-server we can read
    try:
        return "ok", ServerProps.model_validate_json(body)
    except ValidationError:
        return "down", None
