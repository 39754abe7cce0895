"""`bench --workload maintenance` on a few nights: its figures, and the state it leaves (none)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kimi_batch.settings import Settings
from kimi_batch.warehouse import TABLES
from kimi_batch_bench.maintenance import MaintenanceBenchOptions, run_maintenance_bench


def test_a_short_maintenance_bench_reports_commits_and_bounded_metadata(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path))
    settings = Settings.from_env()
    options = MaintenanceBenchOptions(nights=3, partitions=2, rows=3, retention_nights=1)

    document = run_maintenance_bench(settings, options)

    assert len(document["commit_s_by_night"]) == 3
    assert document["commit_s_night1"] > 0
    assert document["commit_s_night30"] == document["commit_s_by_night"][-1]
    assert set(document["tables"]) == set(TABLES)
    for figures in document["tables"].values():
        # One night's snapshots (2 partitions, a delete and an append each) and the 3 tags.
        assert figures["snapshots_kept"] <= 4 + 3
        assert figures["snapshots_expired"] > 0
    assert 0 < document["metadata_bytes_max"] < 1024 * 1024
    assert not (settings.paths.bench_dir / "maintenance-state").exists()
