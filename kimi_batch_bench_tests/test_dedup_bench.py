"""A small real `kimi-batch bench --workload dedup` (no server): its planted repeats found, its
figures written as the `dedup` object, and the index it built on disk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kimi_batch.cli import main


def test_the_dedup_bench_finds_its_planted_repeats_and_writes_its_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path / "home"))
    out = tmp_path / "dedup.json"
    code = main(
        [
            "bench",
            "--workload",
            "dedup",
            "--dedup-rows",
            "600",
            "--rows-per-partition",
            "200",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    figures = json.loads(out.read_text())["dedup"]
    planted = figures["planted_exact"] + figures["planted_near"]
    # An exact copy of a near copy (set aside) is a near repeat of the kept row: the sum is what
    # is planted, less what LSH misses (rare at these similarities; the rows are seeded).
    assert planted * 0.95 <= figures["found_exact"] + figures["found_near"] <= planted
    assert figures["found_exact"] >= figures["planted_exact"] * 0.9
    assert figures["index_rows_per_s"] > 0
    assert 0 < figures["index_mb"] < 5
    assert figures["partition_rows"] == 200
    assert figures["bands"] == "9x13"
    assert (tmp_path / "home" / "bench" / "dedup" / "dedup.sqlite3").is_file()
    assert out.with_suffix(".md").read_text().startswith("| dedup |")
    assert "planted repeats found" in capsys.readouterr().out
