"""The bench's commands refuse a flag out of range in one line, before measuring anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from kimi_batch.cli import main
from kimi_batch.settings import Settings
from kimi_batch_tests.support.ports import free_port
from kimi_batch_tests.support.server_standin import standing_in_for_the_server


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["bench", "--workload", "distill", "--rows", "0"], "bench: rows: "),
        (["bench", "--workload", "rehearsal", "--time-scale", "0"], "bench: time_scale: "),
        (["bench", "--workload", "night", "--partitions", "0"], "bench: partitions: "),
        (["bench", "--workload", "maintenance", "--rows-per-partition", "0"], "bench: rows: "),
        (["bench", "--workload", "dedup", "--dedup-rows", "5"], "bench: rows: "),
        (["tune", "--repetitions", "0"], "tune: repetitions: "),
    ],
    ids=["rows", "time-scale", "partitions", "maintenance-rows", "dedup-rows", "repetitions"],
)
def test_a_flag_out_of_range_is_one_line_before_measuring(
    argv: list[str],
    says: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Found by audit: these were pydantic tracebacks (exit 1), and --partitions 0 quietly
    meant the default."""
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path))

    assert main(argv) == 2

    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"kimi-batch: error: {says}")
    assert not (tmp_path / "bench").exists()
    assert not (tmp_path / "tune").exists()
    assert not (tmp_path / "server").exists()


def test_a_json_path_that_cannot_be_written_names_where_the_figures_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by audit: after the whole measurement, an unwritable --json was a traceback."""
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path))
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    argv = ["bench", "--workload", "dedup", "--dedup-rows", "100", "--rows-per-partition", "10"]

    assert main([*argv, "--json", str(blocked / "dedup.json")]) == 2

    kept = tmp_path / "bench" / "dedup.json"
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"kimi-batch: error: --json {blocked / 'dedup.json'}: cannot write there (File "
        f"exists); the figures are in {kept}"
    )
    assert '"dedup"' in kept.read_text()


def test_a_resident_server_running_beside_the_measurement_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by audit: the bench stops only the server it starts, so `make demo`'s resident
    server shared its cores unsaid. A sleeping process stands in for that server."""
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path))
    monkeypatch.setenv("KIMI_BATCH_LLAMA_PORT", str(free_port()))
    monkeypatch.delenv("KIMI_BATCH_LLAMA_URL", raising=False)
    with standing_in_for_the_server(Settings.from_env()) as stand_in:
        assert main(["bench", "--workload", "distill", "--rows", "0"]) == 2  # stops there

    warning, error = capsys.readouterr().err.splitlines()
    assert warning.startswith(f"kimi-batch: warning: llama-server pid {stand_in.pid} runs")
    assert "(kimi-batch server stop)" in warning
    assert error.startswith("kimi-batch: error: bench: rows: ")
