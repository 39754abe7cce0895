"""The night's report: its headline, the CPU split by process group, the pinned night beside it;
without matplotlib (the `bench` extra), the refusal before any measuring."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from kimi_batch.cli import main
from kimi_batch_bench.cpu import GROUPS
from kimi_batch_bench.report import bench_chart, bench_table


def _night(tok_s: float, one_batch: float, cpu: dict[str, float]) -> dict[str, Any]:
    split = {group: 0.0 for group in GROUPS} | cpu
    return {
        "partitions": 6,
        "rows": 24,
        "runs": 1,
        "busy_fraction": 0.991,
        "wall_s": 180.0,
        "tok_s": tok_s,
        "engine_one_batch_tok_s": one_batch,
        "night_over_one_batch": round(tok_s / one_batch, 4),
        "idle_s": {"run_start": 0.0, "step_start": 0.0, "write": 0.0, "other": 1.2},
        "cpu_s": split | {"machine": 390.0, "wall": 200.0},
        "one_batch_cpu_s": {group: 0.0 for group in GROUPS} | {"llama_server": 70.0, "wall": 40.0},
        "server_tok_s_over_time": [[0.0, 30.0], [2.0, 34.0]],
        "events": [["run", -5.0, 180.0]],
    }


def test_the_night_table_leads_with_night_over_one_batch_and_the_cpu_split(
    tmp_path: Path,
) -> None:
    night = _night(32.0, 36.0, {"llama_server": 300.0, "run_worker": 12.0, "daemon": 8.0})
    pinned = _night(20.0, 21.0, {"llama_server": 190.0, "run_worker": 11.0, "code_servers": 4.0})
    document = {"night": night, "night_pinned": pinned}

    table = bench_table(document)

    assert "**night**: night / one batch **0.889** (32.00 / 36.00 tok/s)" in table
    assert "busy fraction **0.991**" in table
    # run_worker + daemon (+ code servers + webserver): 20 CPU s in 200 s, a tenth of a core.
    assert "orchestration CPU 20.0 s in 200 s (10 % of one core)" in table
    assert "**night_pinned**: night / one batch **0.952**" in table
    assert "pinned night / unpinned night (tok/s): **0.625**" in table
    header = next(line for line in table.splitlines() if line.startswith("| CPU seconds"))
    assert header == "| CPU seconds | night (200 s) | one batch (40 s) | pinned (200 s) |"
    assert "| llama_server | 300.0 | 70.0 | 190.0 |" in table
    assert "| 20.0 | 0.0 | 15.0 |" in table  # the orchestration row
    assert bench_chart(document, tmp_path / "night.png").stat().st_size > 0


@pytest.mark.parametrize("argv", [["bench", "--workload", "distill"], ["tune", "--threads", "1"]])
def test_without_matplotlib_bench_and_tune_name_the_extra_before_measuring(
    argv: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path))
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if the extra were not installed

    assert main(argv) == 2
    assert capsys.readouterr().err.splitlines() == [
        "kimi-batch: error: the bench draws its charts with matplotlib: install the bench extra "
        "(pip install 'kimi_batch[bench]')"
    ]
    assert not (tmp_path / "bench").exists()  # no server, no state: refused before measuring
