"""The server process: its pid record, a detached spawn under the exit-recording waiter, and a
probe of its health that never retries; whose process listens on its port (`port_in_use`,
`port_owners`: an answer on the port is not proof that the server we started gave it); and how
/proc shows any process (`process_stat`), which tells a process from a later one given its pid
(the pid record, lease holders, claim owners)."""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import json
import os
import signal
import socket
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
    """Send `sig` to the process `record` names and to its process group, never to a later
    process given its pid; False when it is gone. Through a pidfd: opened first, then the start
    time checked, so the signal reaches the process that was checked (where pidfds are missing,
    checked just before). The server starts in a session of its own, so its group is what it
    started: a wrapper script (`KIMI_BATCH_LLAMA_SERVER`) that runs llama-server as its child
    without `exec` would otherwise lose only the shell, the server left serving on the port."""
    try:
        handle: int | None = os.pidfd_open(record.pid)
    except ProcessLookupError:
        return False
    except OSError:
        handle = None
    try:
        if not running(record):
            return False
        if os.getpgid(record.pid) == record.pid:
            # A group leader: the group, itself included, first (a leader signalled alone may
            # be gone, and its group's id with it, before the group is).
            os.killpg(record.pid, sig)
        elif handle is None:
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


def port_in_use(host: str, port: int) -> bool:
    """Whether another socket listens on `host`:`port`: a bind of our own is refused (with
    SO_REUSEADDR, so a closed server's TIME_WAIT connections do not count, and without
    SO_REUSEPORT, so a listener that would share the port does). An address this machine does
    not have is not "in use": the server's own bind reports it."""
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError:
        return False
    for family, kind, proto, _, address in addresses:
        try:
            with socket.socket(family, kind, proto) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(address)
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                return True
    return False


_Address = ipaddress.IPv4Address | ipaddress.IPv6Address
_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's `st` column


def _proc_address(hex_address: str) -> _Address:
    """/proc/net/tcp's address: 32-bit words in host (little-endian) byte order."""
    raw = b"".join(
        bytes.fromhex(hex_address[i : i + 8])[::-1] for i in range(0, len(hex_address), 8)
    )
    address = ipaddress.ip_address(raw)
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return mapped or address


def _tcp_listeners(port: int) -> dict[int, _Address] | None:
    """The sockets listening on TCP `port` in this network namespace, by inode, with their
    address; None when /proc does not show them."""
    listeners: dict[int, _Address] = {}
    readable = False
    for table in ("tcp", "tcp6"):
        try:
            rows = Path(f"/proc/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        readable = True
        for row in rows:
            fields = row.split()
            hex_address, hex_port = fields[1].split(":")
            if fields[3] == _LISTEN and int(hex_port, 16) == port:
                listeners[int(fields[9])] = _proc_address(hex_address)
    return listeners if readable else None


def _session_sockets(session: int) -> set[int] | None:
    """Inodes of the sockets held by the processes of `session` (the server, started in a session
    of its own, and whatever it started: a wrapper script's llama-server); None when the
    session's leader's descriptors cannot be read."""
    members = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit():
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[3]) == session:
                    members.append(entry)
        except (OSError, IndexError, ValueError):
            continue
    inodes: set[int] = set()
    for member in members:
        held = _socket_inodes(member)
        if held is None and int(member.name) == session:
            return None
        inodes |= held or set()
    return inodes


def _socket_inodes(process: Path) -> set[int] | None:
    """Inodes of the sockets a /proc/PID folder's process holds; None when its descriptors
    cannot be listed (another user's, gone)."""
    try:
        descriptors = list((process / "fd").iterdir())
    except OSError:
        return None
    inodes: set[int] = set()
    for descriptor in descriptors:
        with contextlib.suppress(OSError):  # closed since it was listed
            link = os.readlink(descriptor)
            if link.startswith("socket:["):
                inodes.add(int(link[8:-1]))
    return inodes


def _takes_connections_of(other: _Address, ours: _Address) -> bool:
    """Whether a listener on `other` would take connections meant for `ours`: the same address,
    or `ours` a wildcard that covers it (IPv6's `::` the IPv4 ones too). Linux hands a connection
    to the listener of its exact address before a wildcard one, so a stranger's wildcard takes
    nothing from our own address."""
    if other == ours:
        return True
    return ours.is_unspecified and (ours.version == other.version or ours.version == 6)


class PortOwners(NamedTuple):
    """Who listens on a port: whether the process (session) asked about does, and how many
    listeners of other processes would take its connections too (SO_REUSEPORT shares a port
    between processes, and the kernel splits the connections between them)."""

    ours: bool
    others: int


def port_owners(port: int, session: int) -> PortOwners | None:
    """Who listens on TCP `port`: the processes of `session` (the server we started) or others;
    None when /proc cannot tell (no /proc, descriptors we may not read)."""
    listeners = _tcp_listeners(port)
    held = _session_sockets(session) if listeners is not None else None
    if listeners is None or held is None:
        return None
    ours = [address for inode, address in listeners.items() if inode in held]
    others = [address for inode, address in listeners.items() if inode not in held]
    if ours:
        others = [a for a in others if any(_takes_connections_of(a, b) for b in ours)]
    return PortOwners(ours=bool(ours), others=len(others))


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
