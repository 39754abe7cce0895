"""A partition another run holds is skipped by the pipeline's own exception, no Dagster; the
Dagster adapter turns it into the step's failure."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest

from kimi_batch.defs.assets.stage_asset import failing_step
from kimi_batch.engine import Ledger
from kimi_batch.pipeline import PartitionSkippedError, driver, partition_lease


def test_a_partition_another_run_holds_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(driver, "LEASE_WAIT_S", 0.2)
    path = tmp_path / "ledger.sqlite3"
    ledgers = lambda: Ledger(path)  # noqa: E731
    with Ledger(path) as ledger, ledger.lease("2026-01-02|src", "other-run"):
        skipped = pytest.raises(PartitionSkippedError, match="being written by another run")
        with skipped, partition_lease(ledgers, "2026-01-02", "src", "this-run"):
            pass
        failed = pytest.raises(dg.Failure, match="being written by another run")
        with failed as failure, failing_step(), partition_lease(ledgers, "2026-01-02", "src", "me"):
            pass
    assert isinstance(failure.value.__cause__, PartitionSkippedError)
    # Let go by the other run, the partition is this run's.
    with partition_lease(ledgers, "2026-01-02", "src", "this-run") as held:
        held.check()
