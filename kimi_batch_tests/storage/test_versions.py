"""The pointer table names one whole version per partition, switched only by the lease holder.

Every test runs on both state backends (`state_backend`: SQLite files, a PostgreSQL database)."""

from __future__ import annotations

import time

import pytest

from kimi_batch.engine.ledger import LeaseLostError, Ledger
from kimi_batch.storage.versions import CurrentVersion, PartitionVersions, version_prefix
from kimi_batch_tests.support.postgres import StateBackend

PARTITION = ("distilled", "2026-12-03", "web")
LEASE = "2026-12-03|web"


def _version(name: str, rows: int = 3) -> CurrentVersion:
    return CurrentVersion(version=name, rows=rows, bytes=100 * rows)


def test_a_switch_makes_the_new_version_current_and_the_old_one_garbage(
    state_backend: StateBackend,
) -> None:
    versions = PartitionVersions(state_backend.ledger)
    versions.create()
    with Ledger(state_backend.ledger) as ledger, ledger.lease(LEASE, "run-a") as lease:
        versions.expect(version_prefix(*PARTITION, "v1"), within_s=3600)
        assert versions.switch(lease, PARTITION, _version("v1"), grace_s=0) is None
        versions.expect(version_prefix(*PARTITION, "v2"), within_s=3600)
        old = versions.switch(lease, PARTITION, _version("v2", rows=5), grace_s=0)
    assert old == "distilled/ds=2026-12-03/source=web/v1"
    assert versions.current(*PARTITION) == _version("v2", rows=5)
    assert versions.partitions("distilled") == [("2026-12-03", "web")]
    assert versions.partitions("amplified") == []
    # v2 was expected and is now current: not garbage; v1 is, and due at once (grace 0).
    assert versions.due() == [old]
    versions.forget(old)
    assert versions.due() == []


def test_a_version_never_switched_to_is_due_after_its_time(state_backend: StateBackend) -> None:
    versions = PartitionVersions(state_backend.ledger)
    versions.create()
    versions.expect(version_prefix(*PARTITION, "killed"), within_s=0.5)
    assert versions.due() == []
    time.sleep(0.7)
    assert versions.due() == ["distilled/ds=2026-12-03/source=web/killed"]
    assert versions.current(*PARTITION) is None


def test_a_holder_that_lost_its_lease_switches_nothing(state_backend: StateBackend) -> None:
    versions = PartitionVersions(state_backend.ledger)
    versions.create()
    with (
        Ledger(state_backend.ledger) as ledger,
        Ledger(state_backend.ledger) as other,
        ledger.lease(LEASE, "paused-run", ttl_s=0.6) as paused,
    ):
        versions.switch(paused, PARTITION, _version("v1"), grace_s=60)
        # Paused (its heartbeat too) past the ttl; another run takes the partition over.
        paused._stop.set()  # pyright: ignore[reportPrivateUsage]
        with other.lease(LEASE, "new-run", wait_s=30, poll_s=0.05) as taken:
            with pytest.raises(LeaseLostError, match="taken over"):
                versions.switch(paused, PARTITION, _version("stale"), grace_s=60)
            versions.switch(taken, PARTITION, _version("v2"), grace_s=60)
    assert versions.current(*PARTITION) == _version("v2")


def test_readers_create_nothing(state_backend: StateBackend) -> None:
    versions = PartitionVersions(state_backend.ledger)
    assert versions.current(*PARTITION) is None
    assert versions.partitions("distilled") == []
    assert versions.due() == []
    if state_backend.name == "sqlite":
        assert state_backend.ledger.path is not None
        assert not state_backend.ledger.path.exists()


def test_a_version_name_that_is_not_a_plain_folder_name_is_refused() -> None:
    with pytest.raises(ValueError, match="version"):
        version_prefix(*PARTITION, "../seeds")
