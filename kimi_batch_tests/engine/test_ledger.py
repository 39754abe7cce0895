"""The ledger keeps every committed row across processes and never records one twice.

Every test runs on both state backends (`state_backend`: SQLite files, a PostgreSQL database)."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

import psycopg
import pytest

from kimi_batch.engine import ledger as ledger_module
from kimi_batch.engine.generation import GenerationResult
from kimi_batch.engine.ledger import Lease, LeaseHeldError, LeaseLostError, Ledger, lease_clock
from kimi_batch.paths import StateLocation
from kimi_batch.state import StateBusyError, StateDatabase, connect_state, read_state
from kimi_batch.warehouse import CatalogSpec, Warehouse
from kimi_batch_tests.support.postgres import PostgresServer, StateBackend
from kimi_batch_tests.support.results import make_result
from kimi_batch_tests.support.rows import quarantined

# Not `no_llama_server`, though none of its tests start one: its leases live for about a second,
# and the slow tests beside llama-server's run niced, starved of CPU for seconds at times.


def _result(request_id: str, text: str = "answer") -> GenerationResult:
    return make_result(text, request_id=request_id, input_id="seed-1", tag="seed")


def test_put_is_first_writer_wins(state_backend: StateBackend) -> None:
    with Ledger(state_backend.ledger) as ledger:
        assert ledger.put(_result("a", "first")) is True
        assert ledger.put(_result("a", "second")) is False
        assert ledger.get_many(["a", "missing"])["a"].text == "first"
        assert ledger.count() == 1


@pytest.mark.slow
@pytest.mark.no_llama_server  # no server started: runs beside the llama tier
def test_rows_committed_by_a_killed_process_survive(state_backend: StateBackend) -> None:
    path = state_backend.ledger
    script = (
        "import os, sys\n"
        "from kimi_batch.engine.ledger import Ledger\n"
        "from kimi_batch.paths import StateLocation\n"
        "from kimi_batch_tests.support.results import make_result\n"
        "ledger = Ledger(StateLocation.model_validate_json(sys.argv[1]))\n"
        "for i in range(5):\n"
        "    ledger.put(make_result(request_id=f'r{i}', input_id='seed-1', tag='seed'))\n"
        "os.kill(os.getpid(), 9)\n"
    )
    killed = subprocess.run([sys.executable, "-c", script, path.model_dump_json()], check=False)
    assert killed.returncode == -9
    with Ledger(path) as ledger:
        assert sorted(ledger.get_many(f"r{i}" for i in range(6))) == [f"r{i}" for i in range(5)]


def test_iter_results_streams_in_the_asked_order_in_chunks(state_backend: StateBackend) -> None:
    with Ledger(state_backend.ledger) as ledger:
        for i in range(7):
            ledger.put(_result(f"r{i}", f"text {i}"))
        asked = ["r6", "missing", "r0", "r3", "r0", "r5", "r1", "r2", "r4"]
        streamed = ledger.iter_results(asked, chunk_size=2)
        first = next(streamed)  # lazy: rows come as they are read, not all at once
        rest = list(streamed)
    assert [r.request_id for r in [first, *rest]] == [k for k in asked if k != "missing"]
    assert rest[0].text == "text 0"


_HOLDER_SCRIPT = (
    "import os, sys\n"
    "from kimi_batch.engine.ledger import Ledger\n"
    "from kimi_batch.paths import StateLocation\n"
    "ledger = Ledger(StateLocation.model_validate_json(sys.argv[1]))\n"
    "with ledger.lease('2025-01-01|web', 'first-run', ttl_s=float(sys.argv[2])):\n"
    "    print('held', flush=True)\n"
    "    if sys.argv[3] == 'die':\n"
    "        os.kill(os.getpid(), 9)\n"
    "    sys.stdin.read()  # held until the test closes stdin\n"
)


def _lease_holder(path: StateLocation, ttl_s: float, *, die: bool) -> subprocess.Popen[str]:
    """A process that takes the lease, says so, then dies by SIGKILL (`die`) or holds it."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _HOLDER_SCRIPT,
            path.model_dump_json(),
            str(ttl_s),
            str(die and "die"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "held"
    return holder


def _hold_lease_then_die(path: StateLocation, ttl_s: float) -> int:
    """The exit status of a process that took the lease and was killed holding it (reaped)."""
    return _lease_holder(path, ttl_s, die=True).wait(timeout=60)


def test_the_lease_of_a_killed_run_on_this_machine_is_taken_over_at_once(
    state_backend: StateBackend,
) -> None:
    path = state_backend.ledger
    assert _hold_lease_then_die(path, ttl_s=600.0) == -9
    with Ledger(path) as ledger, ledger.lease("2025-01-01|web", "run-b") as taken:
        assert taken.owner == "run-b"  # no wait: its holder process is gone


def test_a_killed_holder_not_yet_reaped_is_gone_too(state_backend: StateBackend) -> None:
    """A zombie (killed, its parent has not waited for it yet) holds nothing."""
    path = state_backend.ledger
    holder = _lease_holder(path, ttl_s=600.0, die=True)
    stat = Path(f"/proc/{holder.pid}/stat")
    deadline = time.monotonic() + 30
    while stat.read_text().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline, "the holder never died"
        time.sleep(0.05)
    try:
        with Ledger(path) as ledger, ledger.lease("2025-01-01|web", "run-b") as taken:
            assert taken.owner == "run-b"
    finally:
        assert holder.wait(timeout=30) == -9


def test_a_holder_pid_no_process_can_have_frees_the_lease(state_backend: StateBackend) -> None:
    """A holder naming a pid past any the kernel gives (a damaged row) holds nothing, and the
    check does not crash on it (os.kill raises OverflowError there)."""
    path = state_backend.ledger
    with Ledger(path) as ledger:
        with ledger.lease("2025-01-01|web", "first-run", ttl_s=600.0):
            pass
        with ledger.lease("2025-01-01|web", "damaged", ttl_s=600.0) as held:
            held._stop.set()  # pyright: ignore[reportPrivateUsage] - left held, as by a crash
            machine = ledger_module._this_machine()  # pyright: ignore[reportPrivateUsage]
            with connect_state(path) as db:
                db.execute(
                    "UPDATE leases SET holder = ? WHERE partition_key = ?",
                    (f"{machine}|{10**30}|1", "2025-01-01|web"),
                )
            with Ledger(path) as other, other.lease("2025-01-01|web", "run-b") as taken:
                assert taken.owner == "run-b"


def _lease_is_held_by_the_first_run(path: StateLocation) -> None:
    with (
        pytest.raises(LeaseHeldError, match="first-run"),
        Ledger(path) as ledger,
        ledger.lease("2025-01-01|web", "run-b"),
    ):
        pass


@pytest.mark.parametrize("proc_shows_it", [True, False], ids=["in-proc", "hidden-from-proc"])
def test_a_live_holder_in_another_process_keeps_its_lease(
    state_backend: StateBackend, monkeypatch: pytest.MonkeyPatch, proc_shows_it: bool
) -> None:
    """Hidden: another user's process under /proc's hidepid has no /proc entry; the kernel
    still says it runs, so its lease holds."""
    path = state_backend.ledger
    holder = _lease_holder(path, ttl_s=600.0, die=False)
    try:
        if not proc_shows_it:
            monkeypatch.setattr(ledger_module, "process_stat", lambda _pid: None)
        _lease_is_held_by_the_first_run(path)
    finally:
        assert holder.stdin is not None
        holder.stdin.close()  # it lets go and exits
        assert holder.wait(timeout=60) == 0


def test_the_lease_of_a_killed_run_elsewhere_holds_until_it_expires(
    state_backend: StateBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A holder on another machine (or in another PID namespace): its pid says nothing here, so
    only its expiry frees the partition."""
    path = state_backend.ledger
    monkeypatch.setattr(ledger_module, "_this_machine", lambda: "another-machine/1")
    assert _hold_lease_then_die(path, ttl_s=600.0) == -9
    _lease_is_held_by_the_first_run(path)


def test_the_lease_of_a_killed_run_elsewhere_expires_and_is_taken_over(
    state_backend: StateBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = state_backend.ledger
    monkeypatch.setattr(ledger_module, "_this_machine", lambda: "another-machine/1")
    assert _hold_lease_then_die(path, ttl_s=1.0) == -9
    with Ledger(path) as ledger, ledger.lease("2025-01-01|web", "run-b", wait_s=30, poll_s=0.1):
        pass  # taken over once the dead run's ttl passed


def test_count_by_tag_reads_without_creating_or_writing(state_backend: StateBackend) -> None:
    where = state_backend.ledger
    assert Ledger.count_by_tag(where) == {}
    assert read_state(where) is None  # the reader created nothing: no file, no schema
    assert not where.path.parent.exists()
    with Ledger(where) as ledger:
        ledger.put(make_result("a", request_id="r1", input_id="s1", tag="paraphrase"))
        ledger.put(make_result("b", request_id="r2", input_id="s1", tag="paraphrase"))
        ledger.put(make_result("c", request_id="r3", input_id="s1", tag="seed"))
        # Beside a live writer: the reader sees what is committed.
        assert Ledger.count_by_tag(where) == {"paraphrase": 2, "seed": 1}
    if where.embedded:
        before = where.path.stat().st_mtime_ns
        assert Ledger.count_by_tag(where) == {"paraphrase": 2, "seed": 1}
        assert where.path.stat().st_mtime_ns == before


# ---- leases that hold: a lost lease writes nothing, the heartbeat survives a locked database ---

PARTITION = "2025-01-01|web"


class FlakyConnection:
    """A ledger connection whose lease renewals fail as busy `failures` times (None: always),
    as when another process holds SQLite's write lock or PostgreSQL's connection drops."""

    def __init__(self, db: StateDatabase, failures: list[int | None]) -> None:
        self._db = db
        self._failures = failures

    def execute(self, sql: str, params: Sequence[object] = ()) -> Any:
        left = self._failures[0]
        if sql.startswith("UPDATE leases") and (left is None or left > 0):
            if left is not None:
                self._failures[0] = left - 1
            raise StateBusyError("database is locked")
        return self._db.execute(sql, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)

    def __enter__(self) -> FlakyConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self._db.close()


def flaky_renewals(monkeypatch: pytest.MonkeyPatch, failures: int | None) -> list[int | None]:
    """The failures still to come, in a list the renewals count down."""
    real = ledger_module.connect_state
    left: list[int | None] = [failures]

    def connect(location: StateLocation, **options: Any) -> Any:
        return FlakyConnection(real(location, **options), left)

    monkeypatch.setattr(ledger_module, "connect_state", connect)
    return left


# Polls wait this long at most: a loaded 2-core machine (make test's tiers side by side) takes
# seconds for what takes milliseconds here, and a lease test must not depend on how many.
_POLL_DEADLINE_S = 60.0


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + _POLL_DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"not within {_POLL_DEADLINE_S} s: {what}"
        time.sleep(0.05)


def _renewed_since(lease: Lease, since: float) -> bool:
    """A renewal sent after `since` (`time.monotonic()`) succeeded; a lost lease fails."""
    assert not lease.lost, lease.lost_why
    # The lease counts on itself until a successful renewal's send time plus its ttl.
    return lease._held_until - lease.ttl_s > since  # pyright: ignore[reportPrivateUsage]


def test_the_heartbeat_retries_a_locked_database_and_keeps_the_lease(
    state_backend: StateBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = state_backend.ledger
    with Ledger(path) as first, Ledger(path) as second:
        left = flaky_renewals(monkeypatch, failures=2)  # the first two renewals meet a lock
        # Renewals every ttl/3, a failed one retried after min(1 s, ttl/6): the third try has
        # about half a ttl left for a fresh connection (a ttl of 1.2 s left a PostgreSQL
        # connection 0.4 s, which a loaded 2-core machine overran).
        with first.lease(PARTITION, "run-a", ttl_s=6.0) as lease:
            _until(lambda: left[0] == 0, "both renewals met the lock")
            used_up = time.monotonic()
            _until(lambda: _renewed_since(lease, used_up), "a renewal after the lock")
            monkeypatch.undo()
            with pytest.raises(LeaseHeldError), second.lease(PARTITION, "run-b"):
                pass
            assert not lease.lost
            lease.check()


def test_a_heartbeat_that_cannot_renew_before_the_ttl_marks_the_lease_lost(
    state_backend: StateBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Ledger(state_backend.ledger) as ledger:
        flaky_renewals(monkeypatch, failures=None)  # every renewal meets a lock
        with ledger.lease(PARTITION, "run-a", ttl_s=0.6) as lease:
            _until(lambda: lease.lost, "the lease marked lost")
            with pytest.raises(LeaseLostError, match="lost"):
                lease.check()


def test_a_wall_clock_step_does_not_expire_a_live_lease(
    state_backend: StateBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = state_backend.ledger
    with Ledger(path) as first, Ledger(path) as second, first.lease(PARTITION, "run-a") as lease:
        stepped = time.time() + 3600  # NTP (or a person) sets the clock an hour ahead
        monkeypatch.setattr(time, "time", lambda: stepped)
        with pytest.raises(LeaseHeldError), second.lease(PARTITION, "run-b"):
            pass
        monkeypatch.undo()
        lease.check()


def test_a_lease_from_another_boot_or_clock_is_expired(state_backend: StateBackend) -> None:
    with Ledger(state_backend.ledger) as ledger, connect_state(state_backend.ledger) as db:
        _, now = db.clock()
        db.execute(
            "INSERT INTO leases (partition_key, owner, token, expires_at, boot_id, expires_clock) "
            "VALUES (?, 'run-before-reboot', 't', ?, 'another-boot', ?)",
            (PARTITION, time.time() + 3600, now + 3600),
        )
        with ledger.lease(PARTITION, "run-b") as taken:
            taken.check()


def test_a_sqlite_lease_is_measured_on_the_boot_clock(tmp_path: Path) -> None:
    """The embedded ledger's lease clock is this boot's: a row written with it holds."""
    path = tmp_path / "ledger.sqlite3"
    with Ledger(path) as ledger:
        boot, now = lease_clock()
        with closing(sqlite3.connect(path)) as db:
            db.execute(
                "INSERT INTO leases (partition_key, owner, token, expires_at, boot_id, "
                "expires_clock) VALUES (?, 'run-a', 't', ?, ?, ?)",
                (PARTITION, time.time() + 3600, boot, now + 3600),
            )
            db.commit()
        with pytest.raises(LeaseHeldError, match="run-a"), ledger.lease(PARTITION, "run-b"):
            pass


def test_nobody_takes_the_lease_over_while_a_fenced_write_commits(
    state_backend: StateBackend,
) -> None:
    """A holder that stalls past its ttl between confirming its lease and committing (inside
    `fenced`) still commits before anyone takes the partition over: taking needs the same lock."""
    path = state_backend.ledger
    order: list[str] = []

    def take_over() -> None:
        with Ledger(path) as ledger, ledger.lease(PARTITION, "run-b", wait_s=30, poll_s=0.05):
            order.append("run-b took it")

    # A long ttl to take it (a fresh connection may take seconds on a loaded machine), a short
    # one from the renewal inside `fenced`, which the stall below outlives.
    with Ledger(path) as ledger, ledger.lease(PARTITION, "run-a", ttl_s=60) as lease:
        taker = threading.Thread(target=take_over)
        # A stalled process's heartbeat stalls too.
        lease._stop.set()  # pyright: ignore[reportPrivateUsage]
        lease.ttl_s = 0.6
        with lease.fenced():
            taker.start()
            time.sleep(1.5)  # stalled well past the ttl, the lease confirmed and not committed
            order.append("run-a committed")
        taker.join(timeout=30)
    assert order == ["run-a committed", "run-b took it"]


def test_a_lost_lease_fences_off_the_write(
    tmp_path: Path, state_backend: StateBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    warehouse = Warehouse(CatalogSpec.from_paths(state_backend.paths))
    warehouse.write_partition("quarantine", "2025-01-01", "web", quarantined(1))
    before = warehouse.snapshot_id("quarantine")
    with Ledger(state_backend.ledger) as ledger:
        flaky_renewals(monkeypatch, failures=None)  # every renewal meets a lock: it expires
        with ledger.lease(PARTITION, "run-a", ttl_s=0.6) as lease:
            time.sleep(1.5)
            with pytest.raises(LeaseLostError), lease.fenced():
                pytest.fail("the body of a lost fence ran")
            with pytest.raises(LeaseLostError):
                warehouse.write_partition(
                    "quarantine", "2025-01-01", "web", quarantined(3), guard=lease
                )
    assert warehouse.count("quarantine") == 1
    assert warehouse.snapshot_id("quarantine") == before


@pytest.mark.slow
@pytest.mark.no_llama_server  # no server started: runs beside the llama tier
def test_a_holder_paused_past_the_ttl_writes_nothing_over_the_new_holder(
    tmp_path: Path, state_backend: StateBackend
) -> None:
    path = state_backend.ledger
    warehouse = Warehouse(CatalogSpec.from_paths(state_backend.paths))
    # The old holder: takes the lease, then (when told) writes its rows under the lease check.
    script = (
        "import sys\n"
        "from kimi_batch.engine.ledger import Ledger, LeaseLostError\n"
        "from kimi_batch.paths import StateLocation, StatePaths\n"
        "from kimi_batch.warehouse import CatalogSpec, Warehouse\n"
        "from kimi_batch_tests.support.rows import quarantined\n"
        "ledger = Ledger(StateLocation.model_validate_json(sys.argv[1]))\n"
        "with ledger.lease('2025-01-01|web', 'paused-run', ttl_s=1.0) as lease:\n"
        "    print('held', flush=True)\n"
        "    sys.stdin.readline()\n"
        "    try:\n"
        "        Warehouse(CatalogSpec.from_paths(StatePaths.model_validate_json(sys.argv[2])))"
        ".write_partition('quarantine', '2025-01-01', 'web',\n"
        "            [quarantined(1)[0].model_copy(update={'reason': 'from the paused run'})],\n"
        "            guard=lease)\n"
        "        print('wrote', flush=True)\n"
        "    except LeaseLostError as error:\n"
        "        print('refused:', error, flush=True)\n"
    )
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            script,
            path.model_dump_json(),
            state_backend.paths.model_dump_json(),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdin is not None
        assert holder.stdout.readline().strip() == "held"
        os.kill(holder.pid, signal.SIGSTOP)  # paused (swapped out, a debugger, a VM stall)
        with Ledger(path) as ledger, ledger.lease(PARTITION, "new-run", wait_s=30) as lease:
            warehouse.write_partition(
                "quarantine",
                "2025-01-01",
                "web",
                [quarantined(1)[0].model_copy(update={"reason": "from the new holder"})],
                guard=lease,
            )
            os.kill(holder.pid, signal.SIGCONT)
            holder.stdin.write("go\n")
            holder.stdin.flush()
            said = holder.stdout.readline()
            assert holder.wait(timeout=60) == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(holder.pid, signal.SIGCONT)
        holder.kill()
    assert said.startswith("refused: lease on partition '2025-01-01|web' was lost")
    reasons = warehouse.read_partition("quarantine", "2025-01-01", "web")["reason"].to_list()
    assert reasons == ["from the new holder"]


def test_a_dropped_postgres_connection_is_reconnected_and_the_lease_kept(
    postgres_server: PostgresServer,
) -> None:
    """The database restarts or a proxy drops the heartbeat's connection: it reconnects."""
    url = postgres_server.new_database()
    where = StateLocation(path=Path("unused.sqlite3"), schema_name="kimi_ledger", url=url)
    with Ledger(where) as first, Ledger(where) as second:
        with first.lease(PARTITION, "run-a", ttl_s=6.0) as lease:
            taken = time.monotonic()
            _until(lambda: _renewed_since(lease, taken), "the heartbeat's connection")
            with psycopg.connect(postgres_server.url, autocommit=True) as admin:
                dropped = admin.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = %s AND pid <> pg_backend_pid() AND application_name = ''",
                    (url.rsplit("/", 1)[1],),
                ).fetchone()
            assert dropped is not None
            assert dropped[0] >= 1
            dropped_at = time.monotonic()
            _until(lambda: _renewed_since(lease, dropped_at), "a reconnected heartbeat's renewal")
            lease.check()
        # The ledgers' own connections were dropped too: their next statements reconnect.
        assert first.put(make_result("after", request_id="r-after", input_id="s", tag="seed"))
        with second.lease(PARTITION, "run-b"):
            pass


def test_nul_in_an_answer_or_an_input_id_is_stored_and_counted(
    state_backend: StateBackend,
) -> None:
    """PostgreSQL text cannot hold U+0000 and its JSON refuses the escape: neither may fail a
    put (the engine run) or `status`'s count (issue 42, item 9)."""
    with Ledger(state_backend.ledger) as ledger:
        assert ledger.put(make_result("\x00", request_id="r0", input_id="seed-0", tag="seed"))
        assert Ledger.count_by_tag(state_backend.ledger) == {"seed": 1}
        nul = make_result("an\x00swer", request_id="r1", input_id="in\x00put", tag="seed")
        assert ledger.put(nul) is True
        assert ledger.put(nul) is False  # found again by its key
        assert ledger.put(_result("r2")) is True
        assert ledger.get_many(["r1"])["r1"] == nul
        assert list(ledger.iter_results(["r2", "r1"])) == [_result("r2"), nul]
    assert Ledger.count_by_tag(state_backend.ledger) == {"seed": 3}
