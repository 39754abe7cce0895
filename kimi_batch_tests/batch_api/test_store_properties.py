"""Properties of the Batch API's durable state (`ApiStore`) and the lifecycle steps that run
without a server (`validate_batch`, `resume_abandoned`, `begin_batch`, `finish_batch`,
`request_counts`), against a model, on the embedded (SQLite) backend in a temp dir.

A state machine uploads files (some the same bytes, some refused past the limit, some written
half by a killed writer), deletes them, creates batches claimed by this process, a live one, a
dead one, a later process given a dead one's pid or another host, claims, beats and releases
their validation, moves the clock past the stale time, moves batches by each status change the
store offers (the lifecycle's default, the steps' own `expect` sets, the API's cancel,
`update_batch`), lets two processes race for one batch, validates, takes up, answers and
finishes batches, and crashes: a write stopped after its commit (a crash point), inside its
transaction, or between a delete's two transactions, the store then dropped unclosed and
opened again (perhaps with the API's start-up sweep of unnamed blobs).

What must hold:
- a batch's status moves only along the lifecycle (`NEXT_STATUSES`, plus `finalizing` ->
  `in_progress` for a retried run), never out of a final status, and exactly as the model says
  (compare-and-set: a change from a status the caller did not expect does nothing);
- of two processes racing for a batch, the outcome is that of one after the other (one
  transition to a status wins, never both);
- `request_counts`: completed + failed never exceed the total, and never decrease;
- every file's bytes read back exactly as uploaded (or as the finish wrote them), a refused or
  half-written upload is never listed, and a blob no id names outlives only a stopped delete or
  upload, until the next start;
- a validation claim held by a process that died (or a silent one of another host) is taken
  over, one held by a live process is not; each claim counts one more attempt;
- a store reopened after any of it reads back the same batches and files.
"""

from __future__ import annotations

import hashlib
import io
import os
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from unittest import mock

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
)

from kimi_batch.batch_api import (
    MAX_VALIDATION_ATTEMPTS,
    NEXT_STATUSES,
    TERMINAL_STATUSES,
    ApiStore,
    BatchRecord,
    BatchStatus,
    FileTooLargeError,
    batch_lines,
    begin_batch,
    finish_batch,
    lifecycle,
    process_owner,
    process_token,
    request_counts,
    resume_abandoned,
    validate_batch,
)
from kimi_batch.batch_api import store as store_module
from kimi_batch.crash_points import CrashPointReached, armed
from kimi_batch.engine import Ledger
from kimi_batch.settings import Settings
from kimi_batch.storage import BlobStore
from kimi_batch_tests.support.batches import chat_line, jsonl, landed_batch
from kimi_batch_tests.support.results import make_result

V, IP, FIN = BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS, BatchStatus.FINALIZING
CANCELLING, CANCELLED = BatchStatus.CANCELLING, BatchStatus.CANCELLED
# Above the kernel's largest pid_max (2**22): never a live process.
DEAD_PID = (1 << 22) + 7
HOST = socket.gethostname()
STALE_S = store_module.VALIDATION_STALE_S
MAX_BYTES = 256
MAX_BATCHES = 4
MAX_FILES = 5

# Uploads: valid inputs of 1 to 3 requests, refused ones, and any bytes (a '#' line: never JSON).
INPUTS = (
    jsonl(chat_line("a")),
    jsonl(chat_line("a"), chat_line("b")),
    jsonl(*map(chat_line, "xyz")),
)
CONTENT = st.one_of(
    st.sampled_from(INPUTS),
    st.sampled_from(INPUTS),
    st.sampled_from([b"", b"#not json\n"]),
    st.binary(max_size=40).map(lambda data: b"#" + data),
    st.binary(min_size=MAX_BYTES + 1, max_size=MAX_BYTES + 8),  # over the limit: refused
)
# Who holds a claim: this process, a live one, a dead one, a later process given this one's pid,
# a process of another host (gone only once silent for `VALIDATION_STALE_S`).
OWNERS = ("me", "live", "dead", "reused", "remote")
# (status, expect) of each compare-and-set the lifecycle makes (`lifecycle.py`).
STEPS: tuple[tuple[BatchStatus | None, tuple[BatchStatus, ...]], ...] = (
    (IP, (V, IP, FIN)),  # begin_batch
    (FIN, (IP, FIN)),  # finish_batch, before the files
    (BatchStatus.COMPLETED, (FIN,)),
    (BatchStatus.EXPIRED, (FIN,)),
    (BatchStatus.FAILED, (V, IP, FIN)),
    (BatchStatus.FAILED, (V,)),  # validation failed
    (CANCELLED, (CANCELLING,)),  # settle_cancelled
    (None, (V,)),  # landed: fields only
)
FINAL = (BatchStatus.COMPLETED, BatchStatus.EXPIRED, BatchStatus.FAILED, CANCELLED)


def expected_move(
    status: BatchStatus, target: BatchStatus | None, expect: Sequence[BatchStatus] | None
) -> BatchStatus | None:
    """What `ApiStore.transition` must do: the status it enters, None when it does nothing."""
    if expect is None:
        assert target is not None
        expect = [s for s, after in NEXT_STATUSES.items() if target in after]
    if status not in expect:
        return None
    return target or status


def lifecycle_allows(old: BatchStatus, new: BatchStatus) -> bool:
    """The lifecycle's edges, and a run retried while finalizing taking its batch up again."""
    return old == new or new in NEXT_STATUSES.get(old, ()) or (old, new) == (FIN, IP)


class Clock:
    """The store's and the lifecycle's `time`: the real one, moved on by `offset` seconds."""

    def __init__(self) -> None:
        self.offset = 0.0

    def time(self) -> float:
        return time.time() + self.offset

    def monotonic(self) -> float:
        return time.monotonic()


class Claim:
    def __init__(self, owner: str, heartbeat: float, attempts: int) -> None:
        self.owner, self.heartbeat, self.attempts = owner, heartbeat, attempts


class StoreMachine(RuleBasedStateMachine):
    """The store, a ledger and the model of what they hold (module docstring)."""

    files = Bundle("files")
    batches = Bundle("batches")

    def __init__(self) -> None:
        super().__init__()
        self._tmp = tempfile.TemporaryDirectory()
        home = Path(self._tmp.name)
        with mock.patch.dict(os.environ, {"KIMI_BATCH_HOME": str(home)}):
            os.environ.pop("KIMI_BATCH_DATABASE_URL", None)
            self.settings = Settings.from_env()
        self.paths = self.settings.paths
        self.clock = Clock()
        self._patches = [
            mock.patch.object(store_module, "time", self.clock),
            mock.patch.object(lifecycle, "time", self.clock),
        ]
        for patch in self._patches:
            patch.start()
        self.store = ApiStore(self.paths)
        self.dropped: list[ApiStore] = []  # crashed: never closed until the end
        self.ledger = Ledger(self.paths.ledger_state)
        self.owners = {
            "me": process_owner(),
            "live": f"{HOST}:{process_token(os.getppid())}",
            "dead": f"{HOST}:{DEAD_PID}",
            "reused": f"{HOST}:{process_token()}1",  # this pid, another start: a later process
            "remote": "elsewhere.invalid:4242.99",
        }
        # The model.
        self.contents: dict[str, bytes] = {}  # file id -> its bytes
        self.unnamed_ok: set[str] = set()  # blobs a stopped write may leave until the next start
        self.records: dict[str, BatchRecord] = {}  # as the store must read it back
        self.status: dict[str, BatchStatus] = {}
        self.claims: dict[str, Claim] = {}
        self.planned: dict[str, dict[str, str]] = {}  # batch -> custom_id -> content key
        self.answered: set[str] = set()
        self.counted: dict[str, int] = {}  # batch -> completed + failed seen last

    def teardown(self) -> None:
        for opened in [self.store, *self.dropped]:
            opened.close()
        self.ledger.close()
        for patch in self._patches:
            patch.stop()
        self._tmp.cleanup()

    # ---- helpers ---------------------------------------------------------------------------

    def _owner_kind(self, owner: str) -> str:
        return next(kind for kind, name in self.owners.items() if name == owner)

    def _abandoned(self, claim: Claim, now: float) -> bool:
        kind = self._owner_kind(claim.owner)
        if kind == "remote":
            return now - claim.heartbeat > STALE_S
        return kind in ("dead", "reused")

    def _seen(self, batch_id: str, record: BatchRecord, via: BatchStatus | None = None) -> None:
        """A batch read back after a step: where the model says, by a lifecycle edge (two,
        through `via`, for a finish)."""
        old = self.records[batch_id]
        assert record.status == self.status[batch_id], (old.status, record.status)
        path = (old.status, record.status) if via is None else (old.status, via, record.status)
        assert all(map(lifecycle_allows, path, path[1:])), path
        assert not old.terminal or record.status == old.status
        if record.status != old.status:
            stamp = store_module._STAMPS.get(record.status)  # pyright: ignore[reportPrivateUsage]
            assert stamp is None or getattr(record, stamp) is not None
        self.records[batch_id] = record

    def _reread(self, batch_id: str) -> None:
        record = self.store.batch(batch_id)
        assert record is not None
        self._seen(batch_id, record)

    def _reopen(self, *, sweep: bool) -> None:
        """The process crashed: its store dropped unclosed, another opens it (the API's start
        sweeps the blobs no id names)."""
        self.dropped.append(self.store)
        self.store = ApiStore(self.paths)
        if sweep:
            self.store.remove_unnamed_blobs()
            self.unnamed_ok.clear()

    def _adopt_new_files(self) -> None:
        """Files a crashed step kept after its commit (ids the step never returned)."""
        for record in self.store.files():
            if record.id not in self.contents:
                self.contents[record.id] = self.store.blob_path(record).read_bytes()

    def _adopt_replaced_files(self, batch_id: str) -> None:
        """A finish replaces the files a crashed one kept under the same ids (`lifecycle._kept`)
        with what it writes (another final status words its errors otherwise)."""
        for kind in ("output", "error"):
            file_id = "file-" + hashlib.sha256(f"{batch_id}:{kind}".encode()).hexdigest()[:24]
            found = self.store.file(file_id)
            if found is not None and file_id in self.contents:
                self.contents[file_id] = self.store.blob_path(found).read_bytes()

    # ---- files -----------------------------------------------------------------------------

    @precondition(lambda self: len(self.contents) < MAX_FILES)
    @rule(target=files, data=CONTENT, crash=st.sampled_from(["none", "none", "inside", "after"]))
    def upload(self, data: bytes, crash: str) -> str:
        if len(data) > MAX_BYTES:
            before = sorted(self.contents)
            try:
                self.store.add_file(
                    io.BytesIO(data), filename="big", purpose="batch", max_bytes=MAX_BYTES
                )
            except FileTooLargeError:
                assert sorted(f.id for f in self.store.files()) == before
                return "file-refused"
            raise AssertionError("an upload over the limit was kept")
        if crash == "none":
            record = self.store.add_file(
                io.BytesIO(data), filename="in.jsonl", purpose="batch", max_bytes=MAX_BYTES
            )
            assert record.bytes == len(data)
            self.contents[record.id] = data
            return record.id
        sha = hashlib.sha256(data).hexdigest()
        named = any(content == data for content in self.contents.values())
        if crash == "inside":  # the blob in place, the process gone before the commit
            share = BlobStore.share

            def stopped(blobs: BlobStore, name: str, source: Path | None = None) -> None:
                if source is None:
                    raise CrashPointReached("inside keep_file")
                share(blobs, name, source)

            with mock.patch.object(BlobStore, "share", stopped):
                self._crashing(lambda: self._add(data))
            if not named:
                self.unnamed_ok.add(sha)
        else:
            with armed("api.file_kept"):
                self._crashing(lambda: self._add(data))
        self._reopen(sweep=crash == "inside" and not named)
        self._adopt_new_files()
        ids = [i for i, content in self.contents.items() if content == data]
        return ids[-1] if ids else "file-lost"

    def _add(self, data: bytes) -> object:
        return self.store.add_file(
            io.BytesIO(data), filename="in.jsonl", purpose="batch", max_bytes=MAX_BYTES
        )

    @staticmethod
    def _crashing(step: Callable[[], object]) -> None:
        try:
            step()
        except CrashPointReached:
            return
        raise AssertionError("the step did not reach its crash point")

    @rule(data=st.binary(max_size=30))
    def killed_mid_copy(self, data: bytes) -> None:
        """A writer killed while copying an upload: its temp stays until the next upload, and is
        never a file."""
        temp = self.store.files_dir / f".upload.{DEAD_PID}-{uuid.uuid4().hex}.tmp"
        temp.write_bytes(data)
        self.store.stage_file(io.BytesIO(b"x"), max_bytes=MAX_BYTES).temp.unlink()
        assert not temp.exists()

    @rule(file_id=consumes(files), crash=st.sampled_from(["none", "none", "inside", "between"]))
    def delete(self, file_id: str, crash: str) -> None:
        data = self.contents.get(file_id)
        if data is None:
            assert not self.store.delete_file(file_id)
            return
        sha = hashlib.sha256(data).hexdigest()
        last = [content for content in self.contents.values()].count(data) == 1
        if crash == "none":
            assert self.store.delete_file(file_id)
            del self.contents[file_id]
            if last:
                assert not (self.store.files_dir / sha).exists()
            return
        if crash == "inside" and last:  # stopped before its commit: the file stays whole
            with mock.patch.object(BlobStore, "forget", _stop):
                self._crashing(lambda: self.store.delete_file(file_id))
        elif crash == "between":  # stopped after its commit: bytes no id names
            with mock.patch.object(ApiStore, "_remove_if_unnamed", _stop):
                self._crashing(lambda: self.store.delete_file(file_id))
            del self.contents[file_id]
            if last:
                self.unnamed_ok.add(sha)
        else:
            assert self.store.delete_file(file_id)
            del self.contents[file_id]
        self._reopen(sweep=False)

    # ---- batches ---------------------------------------------------------------------------

    @precondition(lambda self: len(self.records) < MAX_BATCHES)
    @rule(target=batches, file_id=files, owner=st.sampled_from(OWNERS), crash=st.booleans())
    def create(self, file_id: str, owner: str, crash: bool) -> str:
        fields: dict[str, Any] = {
            "input_file_id": file_id,
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
            "completion_window_s": 86400,
            "metadata": {"n": str(len(self.records))},
            "owner": self.owners[owner],
        }
        if crash:
            known = {b.id for b in self.store.batches()}
            with armed("api.batch_added"):
                self._crashing(lambda: self.store.add_batch(**fields))
            self._reopen(sweep=False)
            (record,) = [b for b in self.store.batches() if b.id not in known]
        else:
            record = self.store.add_batch(**fields)
        assert record.status == V
        self.records[record.id] = record
        self.status[record.id] = V
        self.claims[record.id] = Claim(self.owners[owner], self.clock.time(), 0)
        return record.id

    @precondition(lambda self: len(self.records) < MAX_BATCHES and len(self.contents) < MAX_FILES)
    @rule(target=batches, data=st.sampled_from(INPUTS))
    def land(self, data: bytes) -> str:
        """Uploaded, created and validated at once, as the API does it (the usual way)."""
        record = landed_batch(self.settings, data, store=self.store)
        assert record.input_sha256 == hashlib.sha256(data).hexdigest()
        self.contents[record.input_file_id] = data
        self.records[record.id] = record
        self.status[record.id] = V
        return record.id

    def _move(
        self,
        batch_id: str,
        target: BatchStatus | None,
        expect: Sequence[BatchStatus] | None,
        crash: bool,
    ) -> None:
        moves = expected_move(self.status[batch_id], target, expect)
        if crash and moves is not None:
            with armed("api.batch_transitioned"):
                self._crashing(lambda: self.store.transition(batch_id, target, expect=expect))
            self.status[batch_id] = moves
            self._reopen(sweep=False)
            self._reread(batch_id)
            return
        moved = self.store.transition(batch_id, target, expect=expect, run_id="r-cas")
        if moves is None:
            assert moved is None
            assert self.store.batch(batch_id) == self.records[batch_id]  # nothing changed
            return
        assert moved is not None
        assert moved.run_id == "r-cas"
        self.status[batch_id] = moves
        self._seen(batch_id, moved)
        assert self.store.batch(batch_id) == moved

    @rule(batch_id=batches, to=st.sampled_from(BatchStatus), crash=st.booleans())
    def transition(self, batch_id: str, to: BatchStatus, crash: bool) -> None:
        """Any status, by the lifecycle's own expectations: only its edges move."""
        self._move(batch_id, to, None, crash)

    @rule(batch_id=batches, step=st.sampled_from(STEPS), crash=st.booleans())
    def step(
        self,
        batch_id: str,
        step: tuple[BatchStatus | None, tuple[BatchStatus, ...]],
        crash: bool,
    ) -> None:
        """A compare-and-set a lifecycle step makes, whatever the batch's status now."""
        self._move(batch_id, step[0], step[1], crash)

    @rule(batch_id=batches, to=st.sampled_from(BatchStatus))
    def update(self, batch_id: str, to: BatchStatus) -> None:
        """`update_batch`: the fields whatever the status, the status only by an edge."""
        if to in NEXT_STATUSES.get(self.status[batch_id], ()):
            self.status[batch_id] = to
        record = self.store.update_batch(batch_id, status=to, cache_hit_ratio=0.5)
        assert record.cache_hit_ratio == 0.5
        self._seen(batch_id, record)

    @rule(batch_id=batches, crash=st.booleans())
    def cancel(self, batch_id: str, crash: bool) -> None:
        """What `POST /v1/batches/{id}/cancel` does: refused for a final batch."""
        batch = self.store.batch(batch_id)
        assert batch is not None
        if batch.terminal:
            assert batch.status in TERMINAL_STATUSES
            return
        if batch.status == CANCELLING:
            return
        self.status[batch_id] = CANCELLING
        if crash:
            with armed("api.batch_updated"):
                self._crashing(lambda: self.store.update_batch(batch_id, status=CANCELLING))
            self._reopen(sweep=False)
            self._reread(batch_id)
        else:
            self._seen(batch_id, self.store.update_batch(batch_id, status=CANCELLING))

    @rule(
        batch_id=batches,
        first=st.one_of(st.sampled_from(STEPS), st.sampled_from(BatchStatus)),
        second=st.one_of(st.sampled_from(STEPS), st.sampled_from(BatchStatus)),
    )
    def race(
        self,
        batch_id: str,
        first: tuple[BatchStatus | None, tuple[BatchStatus, ...]] | BatchStatus,
        second: tuple[BatchStatus | None, tuple[BatchStatus, ...]] | BatchStatus,
    ) -> None:
        """Two processes, each with its own store, change one batch at once: the outcome is
        that of one after the other."""
        calls = [
            (call, None) if isinstance(call, BatchStatus) else call for call in (first, second)
        ]
        won: list[BatchRecord | None] = [None, None]
        errors: list[BaseException] = []
        barrier = threading.Barrier(2)

        def process(index: int) -> None:
            target, expect = calls[index]
            try:
                with ApiStore(self.paths) as own:
                    barrier.wait()
                    won[index] = own.transition(batch_id, target, expect=expect)
            except BaseException as error:  # reported in the test's thread
                errors.append(error)

        threads = [threading.Thread(target=process, args=(i,)) for i in (0, 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors, errors
        final = self.store.batch(batch_id)
        assert final is not None
        outcome = (won[0] is not None, won[1] is not None, final.status)
        serial = set[tuple[bool, bool, BatchStatus]]()
        for order in ((0, 1), (1, 0)):
            status, moved = self.status[batch_id], [False, False]
            for index in order:
                entered = expected_move(status, *calls[index])
                if entered is not None:
                    status, moved[index] = entered, True
            serial.add((moved[0], moved[1], status))
        assert outcome in serial, (self.status[batch_id], calls, outcome, serial)
        to, expect = calls[0]
        if calls[0] == calls[1] and to is not None and to not in (expect or ()):
            assert not (outcome[0] and outcome[1]), "both processes won one transition"
        # One or two edges, each the model's (`expected_move` of a lifecycle step).
        assert not self.records[batch_id].terminal or final.status == self.status[batch_id]
        self.status[batch_id] = final.status
        self.records[batch_id] = final

    # ---- validation claims -----------------------------------------------------------------

    @rule(batch_id=batches, owner=st.sampled_from(OWNERS))
    def claim(self, batch_id: str, owner: str) -> None:
        name = self.owners[owner]
        held = self.claims.get(batch_id)
        now = self.clock.time()
        takes = held is None or held.owner == name or self._abandoned(held, now)
        claim = self.store.claim_validation(batch_id, name)
        if not takes:
            assert claim is None, f"{owner} took a claim {self._owner_kind(held.owner)} holds"  # type: ignore[union-attr]
            return
        assert claim is not None, f"{owner} was refused a claim (held: {held and held.owner})"
        assert claim.attempts == (held.attempts if held else 0) + 1
        self.claims[batch_id] = Claim(name, claim.heartbeat, claim.attempts)

    @rule(batch_id=batches, owner=st.sampled_from(OWNERS))
    def beat(self, batch_id: str, owner: str) -> None:
        self.store.beat_validation(batch_id, self.owners[owner])
        held = self.claims.get(batch_id)
        if held is not None and held.owner == self.owners[owner]:
            held.heartbeat = self.clock.time()

    @rule(batch_id=batches)
    def release(self, batch_id: str) -> None:
        self.store.release_validation(batch_id)
        self.claims.pop(batch_id, None)

    @rule(seconds=st.sampled_from([1.0, STALE_S / 2, STALE_S + 1]))
    def time_passes(self, seconds: float) -> None:
        self.clock.offset += seconds

    @invariant()
    def claims_are_the_model_s(self) -> None:
        for batch_id in self.records:
            found = self.store.validation_claim(batch_id)
            held = self.claims.get(batch_id)
            if held is None:
                assert found is None
                continue
            assert found is not None
            assert (found.owner, found.attempts) == (held.owner, held.attempts)
            assert found.abandoned(self.clock.time()) == self._abandoned(held, self.clock.time())

    # ---- the lifecycle ---------------------------------------------------------------------

    def _validated(self, batch_id: str, owner: str) -> None:
        """What `validate_batch` must leave (module docstring of `lifecycle`)."""
        status, record = self.status[batch_id], self.records[batch_id]
        if status != V or record.input_sha256:
            if status == CANCELLING:
                self.status[batch_id] = CANCELLED
            self.claims.pop(batch_id, None)
            return
        held = self.claims.get(batch_id)
        if (
            held is not None
            and held.owner != owner
            and not self._abandoned(held, self.clock.time())
        ):
            return
        attempts = (held.attempts if held else 0) + 1
        self.claims.pop(batch_id, None)
        data = self.contents.get(record.input_file_id)
        if attempts > MAX_VALIDATION_ATTEMPTS or data not in INPUTS:
            self.status[batch_id] = BatchStatus.FAILED

    def _check_validated(self, batch_id: str, before: BatchRecord) -> None:
        self._reread(batch_id)
        after = self.records[batch_id]
        data = self.contents.get(before.input_file_id)
        landed = before.input_sha256 is None and after.input_sha256 is not None
        if landed:
            assert data is not None
            assert after.input_sha256 == hashlib.sha256(data).hexdigest()
            assert after.request_total == data.count(b"\n")
            assert (after.source, after.status) == (batch_id, V)
        if after.status == BatchStatus.FAILED and before.status != after.status:
            assert after.errors, "a failed validation says why"

    @rule(batch_id=batches, owner=st.sampled_from(["me", "me", "live"]))
    def validate(self, batch_id: str, owner: str) -> None:
        before = self.records[batch_id]
        self._validated(batch_id, self.owners[owner])
        validate_batch(self.settings, self.store, before, owner=self.owners[owner])
        self._check_validated(batch_id, before)

    @rule()
    def resume(self) -> None:
        """The API's start, or a sensor tick: the abandoned validations taken up."""
        now = self.clock.time()
        expected: list[str] = []
        for batch_id, record in self.records.items():
            if self.status[batch_id] not in (V, CANCELLING) or record.input_sha256 is not None:
                continue
            held = self.claims.get(batch_id)
            if held is not None and not self._abandoned(held, now):
                continue
            expected.append(batch_id)
        before = dict(self.records)
        found = resume_abandoned(
            self.settings,
            self.store,
            validate=lambda batch: validate_batch(self.settings, self.store, batch),
        )
        assert sorted(found) == sorted(expected)
        for batch_id in found:
            if self.status[batch_id] == CANCELLING:
                self.status[batch_id] = CANCELLED
                self.claims.pop(batch_id, None)
            else:
                self._validated(batch_id, self.owners["me"])
            self._check_validated(batch_id, before[batch_id])

    def _landed(self) -> list[str]:
        # In creation order: ids are random, a draw must not depend on them.
        return [b for b, record in self.records.items() if record.input_sha256]

    @precondition(lambda self: bool(self._landed()))
    @rule(data=st.data(), by_hand=st.booleans())
    def begin(self, data: st.DataObject, by_hand: bool) -> None:
        batch_id = data.draw(st.sampled_from(self._landed()))
        status = self.status[batch_id]
        started = begin_batch(self.store, batch_id, run_id="r-begin", by_hand=by_hand)
        if status in (V, IP, FIN):
            self.status[batch_id] = IP
        elif not (by_hand and status in TERMINAL_STATUSES):
            assert started is None
            return
        assert started is not None
        assert (started.status, started.run_id) == (self.status[batch_id], "r-begin")
        self._seen(batch_id, started)

    def _keys(self, batch_id: str) -> dict[str, str]:
        record = self.records[batch_id]
        lines = batch_lines(self.settings, record)
        return {line.custom_id: f"k-{record.input_sha256}-{line.custom_id}" for line in lines}

    @precondition(lambda self: bool(self._landed()))
    @rule(data=st.data())
    def answer(self, data: st.DataObject) -> None:
        """A run (perhaps a rerun by hand of a finished batch) plans the batch's requests and
        answers one of them."""
        batch_id = data.draw(st.sampled_from(self._landed()))
        keys = self._keys(batch_id)
        self.store.set_request_keys(batch_id, keys.items())
        self.planned[batch_id] = keys
        custom_id = data.draw(st.sampled_from(sorted(keys)))
        self.ledger.put(make_result(request_id=keys[custom_id], input_id=custom_id))
        self.answered.add(keys[custom_id])

    @precondition(lambda self: bool(self._landed()))
    @rule(data=st.data(), status=st.sampled_from(FINAL), crash=st.booleans())
    def finish(self, data: st.DataObject, status: BatchStatus, crash: bool) -> None:
        batch_id = data.draw(st.sampled_from(self._landed()))
        current = self.status[batch_id]
        record = self.records[batch_id]
        lines = batch_lines(self.settings, record)
        keys = self.planned.get(batch_id, {})
        done = [line for line in lines if keys.get(line.custom_id) in self.answered]
        written = record.output_file_id is not None or record.error_file_id is not None
        if current in TERMINAL_STATUSES and written:
            final, failed = current, record.request_failed
        elif current in TERMINAL_STATUSES:  # ended without its files: this finish writes them
            final = current
            failed = 0 if current == BatchStatus.COMPLETED else len(lines) - len(done)
        elif (
            status == CANCELLED
            or current == CANCELLING
            or (status != BatchStatus.FAILED and current == V)
        ):
            final, failed = CANCELLED, len(lines) - len(done)
        else:
            final = status
            failed = 0 if status == BatchStatus.COMPLETED else len(lines) - len(done)
        ends = current not in TERMINAL_STATUSES
        files = ends or not written  # a final batch's files are written once
        writes = files and (done or failed)
        if crash and writes:
            # Stopped after keeping its first file: before its final status (a final one kept).
            if ends and final in (BatchStatus.COMPLETED, BatchStatus.EXPIRED):
                self.status[batch_id] = FIN
            elif ends and final == CANCELLED:
                self.status[batch_id] = CANCELLING
            with armed("api.file_kept"):
                self._crashing(
                    lambda: finish_batch(self.store, self.ledger, batch_id, lines, status)
                )
            self._reopen(sweep=False)
            self._adopt_new_files()
            self._adopt_replaced_files(batch_id)
            self._reread(batch_id)
            return
        result = finish_batch(self.store, self.ledger, batch_id, lines, status)
        self._adopt_replaced_files(batch_id)
        self.status[batch_id] = final
        via = {CANCELLED: CANCELLING, BatchStatus.COMPLETED: FIN, BatchStatus.EXPIRED: FIN}
        self._seen(batch_id, result, None if final == current else via.get(final))
        assert self.store.batch(batch_id) == result
        assert result.request_failed == failed, (current, status, result.request_failed, failed)
        if not files:
            return
        for file_id, count in ((result.output_file_id, len(done)), (result.error_file_id, failed)):
            if not count:
                assert file_id is None
                continue
            assert file_id is not None
            found = self.store.file(file_id)
            assert found is not None
            content = self.store.blob_path(found).read_bytes()
            assert content.count(b"\n") == count
            self.contents[file_id] = content

    # ---- reopening -------------------------------------------------------------------------

    @rule(sweep=st.booleans())
    def crash_and_reopen(self, sweep: bool) -> None:
        self._reopen(sweep=sweep)

    @invariant()
    def reads_back_the_same(self) -> None:
        """Every batch as the model last saw it, every file's bytes as kept, nothing else."""
        assert {b.id: b for b in self.store.batches()} == self.records
        for batch_id, record in self.records.items():
            assert self.store.batch(batch_id) == record
            assert record.status == self.status[batch_id]
        listed = {f.id: f for f in self.store.files()}
        assert sorted(listed) == sorted(self.contents)
        for file_id, data in self.contents.items():
            assert listed[file_id].bytes == len(data)
            assert self.store.blob_path(listed[file_id]).read_bytes() == data
        named = {f.sha256 for f in listed.values()}
        blobs = {p.name for p in self.store.files_dir.iterdir() if not p.name.startswith(".")}
        assert blobs - named <= self.unnamed_ok, blobs - named
        assert named <= blobs

    @invariant()
    def request_counts_stay_within_the_total_and_grow(self) -> None:
        for batch_id, record in self.records.items():
            counts = request_counts(self.store, self.ledger, record)
            assert counts.total == record.request_total
            assert counts.completed + counts.failed <= counts.total, (record.status, counts)
            seen = counts.completed + counts.failed
            assert seen >= self.counted.get(batch_id, 0), (record.status, counts)
            self.counted[batch_id] = seen


def _stop(*_: object) -> None:
    raise CrashPointReached("stopped")


TestStoreMachine = StoreMachine.TestCase
TestStoreMachine.settings = settings(
    max_examples=100,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def test_a_request_answered_by_a_rerun_after_the_batch_ended_is_not_counted_twice() -> None:
    """Found by the machine: a batch ended with its request failed (cancelled, here) and then
    rerun by hand (which sends what the ledger lacks and keeps the status) reported the request
    both completed (the ledger) and failed (the final count): 2 of 1."""
    machine = StoreMachine()
    try:
        machine.land(INPUTS[0])
        ((batch_id, record),) = machine.records.items()
        lines = batch_lines(machine.settings, record)
        done = finish_batch(machine.store, machine.ledger, batch_id, lines, CANCELLED)
        assert (done.status, done.request_failed) == (CANCELLED, 1)
        rerun = begin_batch(machine.store, batch_id, run_id="by-hand", by_hand=True)
        assert rerun is not None
        (key,) = machine._keys(batch_id).items()  # pyright: ignore[reportPrivateUsage]
        machine.store.set_request_keys(batch_id, [key])
        machine.ledger.put(make_result(request_id=key[1], input_id=key[0]))
        counts = request_counts(machine.store, machine.ledger, rerun)
        assert (counts.total, counts.completed, counts.failed) == (1, 1, 0)
    finally:
        machine.teardown()
