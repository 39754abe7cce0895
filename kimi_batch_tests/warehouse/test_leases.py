"""A partition lease decides who commits: it is confirmed inside the catalog commit itself."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pytest

from kimi_batch.engine import LeaseLostError, Ledger
from kimi_batch.engine.ledger import Lease
from kimi_batch.warehouse import CatalogSpec, Warehouse
from kimi_batch_tests.support.postgres import StateBackend
from kimi_batch_tests.support.rows import quarantined

DS, SOURCE = "2025-01-01", "web"
PARTITION = f"{DS}|{SOURCE}"


def _stall(lease: Lease) -> None:
    """The holder stalls: its heartbeat stops (a paused process renews nothing)."""
    lease._stop.set()  # pyright: ignore[reportPrivateUsage]
    lease._thread.join()  # pyright: ignore[reportPrivateUsage]


def _rows(reason: str, count: int = 1) -> Iterable[object]:
    return [row.model_copy(update={"reason": reason}) for row in quarantined(count)]


def test_a_lease_lost_between_the_check_and_the_commit_commits_nothing(
    state_backend: StateBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    warehouse = Warehouse(CatalogSpec.from_paths(state_backend.paths))
    warehouse.write_partition("quarantine", DS, SOURCE, _rows("before", 2))  # type: ignore[arg-type]
    before = warehouse.snapshot_id("quarantine")
    writable = Warehouse._writable  # pyright: ignore[reportPrivateUsage]
    with Ledger(state_backend.ledger) as ledger, ledger.lease(PARTITION, "old", ttl_s=1.0) as old:

        def check_then_lose(self: Warehouse, table: str, schema: pa.Schema) -> object:
            found = writable(self, table, schema)
            old.check()  # the check before the commit passes ...
            _stall(old)  # ... then the writer stalls past its ttl and another run takes over
            time.sleep(1.5)
            with Ledger(state_backend.ledger) as other:
                taken = other.lease(PARTITION, "new", ttl_s=60.0)
                taken.__enter__()
                monkeypatch.setattr(Warehouse, "_writable", writable)
            return found

        monkeypatch.setattr(Warehouse, "_writable", check_then_lose)
        with pytest.raises(LeaseLostError):
            warehouse.write_partition("quarantine", DS, SOURCE, _rows("late"), guard=old)  # type: ignore[arg-type]

    assert warehouse.snapshot_id("quarantine") == before
    reasons = warehouse.read_partition("quarantine", DS, SOURCE)["reason"].to_list()
    assert reasons == ["before", "before"]


def test_the_holder_commits_and_renews_its_lease_in_the_commit(state_backend: StateBackend) -> None:
    warehouse = Warehouse(CatalogSpec.from_paths(state_backend.paths))
    with (
        Ledger(state_backend.ledger) as ledger,
        ledger.lease(PARTITION, "run", ttl_s=60.0) as lease,
    ):
        written = warehouse.write_partition("quarantine", DS, SOURCE, _rows("held"), guard=lease)  # type: ignore[arg-type]
    assert written.rows == 1
    assert warehouse.snapshot_id("quarantine") == written.snapshot_id
    assert warehouse.read_partition("quarantine", DS, SOURCE)["reason"].to_list() == ["held"]


def test_a_writer_whose_lease_expired_commits_nothing(state_backend: StateBackend) -> None:
    warehouse = Warehouse(CatalogSpec.from_paths(state_backend.paths))
    with Ledger(state_backend.ledger) as ledger, ledger.lease(PARTITION, "old", ttl_s=1.0) as old:
        _stall(old)
        time.sleep(1.5)
        with (
            Ledger(state_backend.ledger) as other,
            other.lease(PARTITION, "new", ttl_s=60.0),
            pytest.raises(LeaseLostError),
        ):
            warehouse.write_partition("quarantine", DS, SOURCE, _rows("late"), guard=old)  # type: ignore[arg-type]
    assert warehouse.snapshot_id("quarantine") is None
    assert warehouse.read_partition("quarantine", DS, SOURCE).height == 0


def test_the_folder_warehouse_s_catalog_is_the_state_dir_s_ledger(tmp_path: Path) -> None:
    spec = CatalogSpec.for_folder(tmp_path / "warehouse")
    assert spec.sqlite_path == tmp_path / "ledger" / "ledger.sqlite3"
    assert spec.warehouse == (tmp_path / "warehouse").as_uri()
