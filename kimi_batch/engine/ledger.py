"""Durable per-row ledger: every finished request is committed before the next one is counted.

A row is either committed (and skipped by every rerun) or absent (and sent again), whatever
kills the process: each `put` is its own durable commit, in the store's database
(`kimi_batch.state`: a SQLite file in WAL mode with `synchronous=FULL` by default, PostgreSQL
when `KIMI_BATCH_DATABASE_URL` is set). The key is the request's hash (`generation.request_key`):
a rerun finds every row it finished, and a determined request (greedy or seeded) asked in another
partition or run, on any worker sharing the database, is never generated twice either.

Partition leases live in the same database. A lease's expiry is measured on the database's lease
clock (`StateDatabase.clock`): the machine's boot clock for SQLite (it never jumps, and a lease
from before a reboot is expired), the database server's clock for PostgreSQL (workers on other
machines agree on it). A lease is taken in a transaction under the store's write lock (one taker
wins). A heartbeat renews it; a transient database error (a lock, a dropped connection) is retried
until the lease would have run out, and only then is it `lost`. Every partition write calls
`Lease.check` first, which renews the lease in one atomic statement and fails (LeaseLostError)
instead of letting a holder that stalled past the ttl write over the run that took it over. A
write that commits by itself (a Parquet file renamed into place) commits inside `Lease.fenced`:
a transaction holding the store's write lock in which the lease is renewed, so a holder that
stalls between its check and its commit cannot commit after losing the lease (taking a lease
needs the same lock).

A lease also names its holder process (`holder`: this machine's boot and PID namespace, the pid
and its start time). A taker on the same machine that finds the holder gone (no such process, a
later process with that pid, or a zombie) takes the lease at once instead of waiting out the ttl:
a killed run's rerun starts now, not a minute later. A holder elsewhere (another machine, another
container) is judged by its expiry alone.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path

from pydantic_core import PydanticSerializationError

from kimi_batch.crash_points import crash_point
from kimi_batch.engine.generation import GenerationResult
from kimi_batch.errors import KimiBatchError
from kimi_batch.llama import process_stat
from kimi_batch.paths import StateLocation
from kimi_batch.state import (
    StateBusyError,
    StateDatabase,
    StateError,
    boot_clock,
    connect_state,
    read_state,
)

logger = logging.getLogger(__name__)

_SCHEMA = (
    """
    CREATE TABLE IF NOT EXISTS results (
        request_id  TEXT PRIMARY KEY,
        input_id    TEXT NOT NULL,
        result_json TEXT NOT NULL,
        finished_at {real} NOT NULL
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS leases (
        partition_key TEXT PRIMARY KEY,
        owner         TEXT NOT NULL,
        token         TEXT NOT NULL,
        expires_at    {real} NOT NULL,
        boot_id       TEXT,
        expires_clock {real},
        holder        TEXT
    )
    """,
)
# Columns added after the first release; older ledgers get them on open.
_LEASE_COLUMNS = (("boot_id", "TEXT"), ("expires_clock", "{real}"), ("holder", "TEXT"))
# A heartbeat that meets a locked database tries again this often (and waits on the lock at most
# as long), until the lease would have expired.
_RETRY_S = 1.0
# The ledger's schema in a PostgreSQL database (`StatePaths.ledger_state`).
_SCHEMA_NAME = "kimi_ledger"

# The SQLite ledger's lease clock (tests write leases of another boot with it).
lease_clock = boot_clock


def _location(where: StateLocation | Path) -> StateLocation:
    """A bare path is a SQLite ledger file (tests and the bench name their own)."""
    if isinstance(where, StateLocation):
        return where
    return StateLocation(path=where, schema_name=_SCHEMA_NAME)


def _live(row: tuple[object, ...], clock: str, now_clock: float) -> bool:
    """Whether a lease row (owner, expires_at, boot_id, expires_clock, ...) still holds."""
    _, expires_at, boot_id, expires_clock = row[:4]
    if boot_id is None or expires_clock is None:
        return float(expires_at) > time.time()  # type: ignore[arg-type] - a row of older code
    # Another boot (or another clock): its holder cannot be running any more.
    return boot_id == clock and float(expires_clock) > now_clock  # type: ignore[arg-type]


# ---- the holder process -------------------------------------------------------------------------


@functools.cache
def _this_machine() -> str | None:
    """This boot (the state layer's boot id) and PID namespace, where a pid names one process;
    None without Linux's /proc. Fixed for the life of the process: read once."""
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None
    return f"{boot_clock()[0]}/{namespace}"


def _this_holder() -> str | None:
    """The `holder` of a lease this process takes: machine|pid|start time."""
    machine, pid = _this_machine(), os.getpid()
    stat = process_stat(pid)
    return None if machine is None or stat is None else f"{machine}|{pid}|{stat.start_ticks}"


def _holder_gone(holder: object) -> bool:
    """Whether a lease's holder process ran on this machine and has exited since (a zombie has:
    it holds nothing, its parent has only not reaped it yet)."""
    if not isinstance(holder, str) or holder.count("|") != 2:
        return False  # a lease of older code, or of a machine without /proc
    machine, pid, started = holder.split("|")
    if machine != _this_machine() or not pid.isdigit():
        return False  # another machine's or container's pid: only its expiry tells
    stat = process_stat(int(pid))
    if stat is None:
        # No such process, or another user's that /proc hides (hidepid): the kernel tells which.
        try:
            os.kill(int(pid), 0)
        except (ProcessLookupError, OverflowError):  # no such pid (or none that large)
            return True
        except PermissionError:
            pass
        return False
    return stat.exited or str(stat.start_ticks) != started


class LeaseHeldError(KimiBatchError, RuntimeError):
    """Another run holds the partition's lease and did not let go in time."""

    def __init__(self, partition_key: str, owner: str, expires_in_s: float) -> None:
        super().__init__(
            f"partition {partition_key!r} is being processed by {owner} (lease expires in "
            f"{expires_in_s:.0f} s unless renewed); try again when that run ends"
        )
        self.partition_key = partition_key
        self.owner = owner


class LeaseLostError(KimiBatchError, RuntimeError):
    """This run's lease expired (it stalled past the ttl) or was taken over: it must not write."""

    def __init__(self, partition_key: str, why: str) -> None:
        super().__init__(
            f"lease on partition {partition_key!r} was lost ({why}); nothing more is written "
            "by this run, the run that holds the partition now writes it"
        )
        self.partition_key = partition_key


class UnstorableResultError(KimiBatchError, ValueError):
    """A finished result the ledger cannot keep as it is: it would not read back as written."""


def _stored_json(result: GenerationResult) -> str:
    """The ledger's text of `result`, refused if it would not read back as `result`: a lone
    surrogate (UTF-8 cannot encode it), a NaN or infinite float (JSON writes null: a row every
    rerun skips as finished and every read fails on) or a UTC offset with seconds (written to the
    minute). Checked field by field, not by parsing the text back: a put runs on the engine's
    event loop once per answer, and an answer with 20 logprobs a token took 15 times longer."""
    why = _changed_by_json(result)
    if why is None:
        try:
            return result.model_dump_json()
        except PydanticSerializationError as error:
            why = str(error)
    raise UnstorableResultError(
        f"ledger: the result of request {result.request_id[:64]!r} cannot be stored: {why}"
    )


def _changed_by_json(result: GenerationResult) -> str | None:
    """What of `result` JSON would not keep (None: nothing). Its only floats are the timings
    and the logprobs; its only time is `created_at`."""
    for name in ("prompt_ms", "predicted_ms", "latency_ms"):
        if not math.isfinite(getattr(result, name)):
            return f"{name} is {getattr(result, name)}, which JSON writes as null"
    for index, token in enumerate(result.logprobs or ()):
        if not math.isfinite(token.logprob) or not all(
            math.isfinite(top.logprob) for top in token.top
        ):
            return f"logprobs[{index}] holds a non-finite logprob, which JSON writes as null"
    offset = result.created_at.utcoffset()
    if offset is not None and (offset.seconds % 60 or offset.microseconds):
        return f"created_at's UTC offset {offset} has seconds, which its text cuts to the minute"
    return None


class Lease:
    """A held partition lease; a heartbeat thread renews it until the context exits."""

    def __init__(
        self, location: StateLocation, partition_key: str, owner: str, token: str, ttl_s: float
    ):
        self.partition_key = partition_key
        self.owner = owner
        self.token = token
        self.ttl_s = ttl_s
        self.lost = False
        self.lost_why = ""
        self._location = location
        # On this process's own clock: how long it may still count on the lease, measured from
        # before the last renewal was sent (never later than the database's expiry).
        self._held_until = time.monotonic() + ttl_s
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._heartbeat, name=f"lease-{partition_key}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def _connect(self) -> StateDatabase:
        # A short busy timeout, so a locked database is retried within the ttl rather than
        # waited on past it.
        return connect_state(self._location, timeout_s=min(_RETRY_S, self.ttl_s / 6))

    def _renew(self, db: StateDatabase) -> bool:
        """Extend the lease if this run still holds it (same token, not expired); atomic."""
        sent = time.monotonic()
        clock, now = db.clock()
        renewed = db.execute(
            "UPDATE leases SET expires_at = ?, boot_id = ?, expires_clock = ? "
            "WHERE partition_key = ? AND token = ? AND boot_id = ? AND expires_clock > ?",
            (
                time.time() + self.ttl_s,
                clock,
                now + self.ttl_s,
                self.partition_key,
                self.token,
                clock,
                now,
            ),
        ).rowcount
        if renewed:
            self._held_until = sent + self.ttl_s
        return bool(renewed)

    def _mark_lost(self, why: str) -> None:
        if not self.lost:
            self.lost, self.lost_why = True, why
            logger.error("lease on %s was lost: %s", self.partition_key, why)

    def _heartbeat(self) -> None:
        # Its own connection: a transaction on the ledger's connection from another thread
        # would interleave with the writer's.
        db: StateDatabase | None = None
        try:
            wait = self.ttl_s / 3
            while not self._stop.wait(wait):
                try:
                    db = db or self._connect()
                    if not self._renew(db):
                        self._mark_lost("expired and taken over by another run")
                        return
                    wait = self.ttl_s / 3
                except StateBusyError as error:  # a lock, a dropped connection: transient
                    if time.monotonic() >= self._held_until:
                        self._mark_lost(f"could not renew it before it expired: {error}")
                        return
                    logger.warning(
                        "lease on %s: renewal failed (%s), retrying", self.partition_key, error
                    )
                    db = _closed(db)
                    wait = min(_RETRY_S, self.ttl_s / 6)
        except Exception as error:
            self._mark_lost(f"heartbeat failed: {type(error).__name__}: {error}")
        finally:
            _closed(db)

    def check(self) -> None:
        """Raise LeaseLostError unless this run still holds the partition (renewing it): called
        before every write of the partition's tables."""
        with self._confirmed(lock=False):
            pass

    def fenced(self) -> AbstractContextManager[StateDatabase]:
        """A transaction on the ledger's store, under its write lock, in which this run holds
        the partition (renewed inside it): what the caller commits in it is committed by the
        holder only, and nobody takes the lease over until it ends. LeaseLostError otherwise."""
        return self._confirmed(lock=True)

    @contextmanager
    def _confirmed(self, *, lock: bool) -> Iterator[StateDatabase]:
        """A connection on which the lease was just renewed (inside an open transaction when
        `lock`); a busy database is tried again until the lease could have run out."""
        if self.lost:
            raise LeaseLostError(self.partition_key, self.lost_why)
        deadline = time.monotonic() + self.ttl_s / 3
        with ExitStack() as held:
            while True:
                try:
                    with ExitStack() as attempt:
                        db = attempt.enter_context(self._connect())
                        if lock:
                            attempt.enter_context(db.transaction())
                        renewed = self._renew(db)
                        held.push(attempt.pop_all())
                    break
                except StateBusyError as error:
                    if time.monotonic() >= min(deadline, self._held_until):
                        self._mark_lost(f"could not be confirmed: {error}")
                        raise LeaseLostError(self.partition_key, self.lost_why) from error
                    time.sleep(min(_RETRY_S, self.ttl_s / 6))
            if not renewed:
                self._mark_lost("expired and taken over by another run")
                raise LeaseLostError(self.partition_key, self.lost_why)
            yield db

    def confirm_in(self, db: StateDatabase) -> None:
        """Renew the lease inside the caller's transaction on `db` (see `Fence.confirm_in`)."""
        if self.lost:
            raise LeaseLostError(self.partition_key, self.lost_why)
        db.lock_store()
        if not self._renew(db):
            self._mark_lost("expired and taken over by another run")
            raise LeaseLostError(self.partition_key, self.lost_why)

    def release(self) -> None:
        self._stop.set()
        self._thread.join()
        with connect_state(self._location) as db:
            db.execute(
                "DELETE FROM leases WHERE partition_key = ? AND token = ?",
                (self.partition_key, self.token),
            )


def _closed(db: StateDatabase | None) -> None:
    if db is not None:
        try:
            db.close()
        except StateError:
            logger.debug("closing a lease connection failed", exc_info=True)


class Ledger:
    """Finished results keyed by request id."""

    def __init__(self, location: StateLocation | Path) -> None:
        self.location = _location(location)
        # Autocommit: each `put` is its own durable transaction. (The SQLite file's folder is
        # created owner-only: prompts and answers.)
        self._db = connect_state(self.location)
        self._db.create(_SCHEMA)
        self._db.add_columns("leases", _LEASE_COLUMNS)

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def put(self, result: GenerationResult) -> bool:
        """Record a finished result; False when the request was already recorded.
        UnstorableResultError, with nothing written, for one that would not read back as is."""
        payload = _stored_json(result)
        cursor = self._db.execute(
            "INSERT INTO results (request_id, input_id, result_json, finished_at) "
            "VALUES (?, ?, ?, ?) ON CONFLICT (request_id) DO NOTHING",
            (result.request_id, result.input_id, payload, time.time()),
        )
        crash_point("ledger.result_recorded")
        return cursor.rowcount == 1

    def get_many(self, request_ids: Iterable[str]) -> dict[str, GenerationResult]:
        ids = list(dict.fromkeys(request_ids))
        found: dict[str, GenerationResult] = {}
        for start in range(0, len(ids), 500):
            found.update(self._fetch(ids[start : start + 500]))
        return found

    def _fetch(self, ids: list[str]) -> dict[str, GenerationResult]:
        placeholders = ",".join("?" * len(ids))
        rows = self._db.execute(
            f"SELECT request_id, result_json FROM results WHERE request_id IN ({placeholders})",
            ids,
        )
        return {key: GenerationResult.model_validate_json(payload) for key, payload in rows}

    def finished_keys(self, request_ids: Iterable[str]) -> set[str]:
        """Which of these requests are recorded, without loading their results."""
        ids = list(dict.fromkeys(request_ids))
        found: set[str] = set()
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            placeholders = ",".join("?" * len(chunk))
            rows = self._db.execute(
                f"SELECT request_id FROM results WHERE request_id IN ({placeholders})", chunk
            )
            found.update(key for (key,) in rows)
        return found

    def iter_results(
        self, request_ids: Iterable[str], *, chunk_size: int = 256
    ) -> Iterator[GenerationResult]:
        """Results in the order of `request_ids` (missing ones skipped, repeats repeated),
        `chunk_size` rows in memory at a time: a partition streams to Parquet in chunks."""
        if chunk_size < 1:
            raise ValueError("chunk_size must be positive")
        chunk: list[str] = []
        for request_id in request_ids:
            chunk.append(request_id)
            if len(chunk) == chunk_size:
                yield from self._ordered(chunk)
                chunk = []
        if chunk:
            yield from self._ordered(chunk)

    def _ordered(self, ids: list[str]) -> Iterator[GenerationResult]:
        found = self._fetch(list(dict.fromkeys(ids)))
        for request_id in ids:
            if request_id in found:
                yield found[request_id]

    @contextmanager
    def lease(
        self,
        partition_key: str,
        owner: str,
        *,
        ttl_s: float = 60.0,
        wait_s: float = 0.0,
        poll_s: float = 1.0,
    ) -> Iterator[Lease]:
        """Hold the partition for one run: a second holder waits up to `wait_s`, then gets
        `LeaseHeldError`. The lease is renewed every ttl/3 while held, so only a process that
        stalls (or died) for a whole ttl loses it, and an expired lease is taken over."""
        token = uuid.uuid4().hex
        deadline = time.monotonic() + wait_s
        while True:
            holder = self._try_lease(partition_key, owner, token, ttl_s)
            if holder is None:
                break
            held_by, expires_in_s = holder
            if time.monotonic() >= deadline:
                raise LeaseHeldError(partition_key, held_by, expires_in_s)
            time.sleep(min(poll_s, max(deadline - time.monotonic(), 0.0)))
        lease = Lease(self.location, partition_key, owner, token, ttl_s)
        lease.start()
        try:
            yield lease
        finally:
            lease.release()

    def _try_lease(
        self, partition_key: str, owner: str, token: str, ttl_s: float
    ) -> tuple[str, float] | None:
        """Take the lease if it is free or expired; else (holder, seconds until it expires)."""
        with self._db.transaction():  # one writer decides: no two takers of one lease
            clock, now = self._db.clock()
            row = self._db.execute(
                "SELECT owner, expires_at, boot_id, expires_clock, holder FROM leases "
                "WHERE partition_key = ?",
                (partition_key,),
            ).fetchone()
            gone = row is not None and _holder_gone(row[4])
            if row is not None and not gone and _live(row, clock, now):
                left = float(row[3]) - now if row[3] is not None else float(row[1]) - time.time()
                return str(row[0]), left
            if row is not None:
                why = "its process has exited" if gone else "it expired"
                logger.warning("taking over %s's lease on %s: %s", row[0], partition_key, why)
            self._db.execute(
                "INSERT INTO leases "
                "(partition_key, owner, token, expires_at, boot_id, expires_clock, holder) "
                "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (partition_key) DO UPDATE SET "
                "owner = excluded.owner, token = excluded.token, "
                "expires_at = excluded.expires_at, boot_id = excluded.boot_id, "
                "expires_clock = excluded.expires_clock, holder = excluded.holder",
                (
                    partition_key,
                    owner,
                    token,
                    time.time() + ttl_s,
                    clock,
                    now + ttl_s,
                    _this_holder(),
                ),
            )
            return None

    def count(self) -> int:
        return int(self._db.execute("SELECT count(*) FROM results").fetchone()[0])

    @staticmethod
    def count_by_tag(location: StateLocation | Path) -> dict[str, int]:
        """Finished requests per request tag, read-only: {} when there is no ledger yet.

        Opens no writer (no WAL switch, no schema), so a reader beside a running batch never
        holds a write lock and a status call never creates the ledger.
        """
        db = read_state(_location(location))
        if db is None:
            return {}
        with db:
            tag = db.json_text("result_json", "tag")
            rows = db.execute(f"SELECT {tag}, count(*) FROM results GROUP BY 1").fetchall()
        counts: dict[str, int] = {}
        for tag, count in rows:  # a NULL tag counts as ""
            counts[str(tag or "")] = counts.get(str(tag or ""), 0) + int(count)
        return counts
