"""`tune`: the knees (pure) and a tiny real sweep with llama-bench and llama-batched-bench."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kimi_batch.cli import main
from kimi_batch_bench.sweeps import BatchedPoint, ThreadPoint
from kimi_batch_bench.tune import flash_attn_choice, slot_knee, thread_knee
from kimi_batch_bench_tests.own_build import own_build


def _threads(*speeds: float) -> list[ThreadPoint]:
    return [ThreadPoint(threads=i + 1, prompt_tok_s=100, gen_tok_s=s) for i, s in enumerate(speeds)]


def _slots(*pairs: tuple[int, float]) -> list[BatchedPoint]:
    return [
        BatchedPoint(
            slots=n, prompt_tokens=64, output_tokens=8, prompt_tok_s=1, gen_tok_s=s, total_tok_s=s
        )
        for n, s in pairs
    ]


def test_thread_knee_is_the_fewest_threads_within_10_percent_of_the_best() -> None:
    assert thread_knee(_threads(5, 9, 9.5, 10, 9.8)) == 2  # 9 >= 0.9 x 10
    assert thread_knee(_threads(5, 8.9, 10)) == 3


def test_slot_knee_is_where_more_slots_add_less_than_10_percent() -> None:
    assert slot_knee(_slots((1, 10), (2, 18), (4, 30), (8, 32))) == 4
    assert slot_knee(_slots((1, 10), (2, 10.5), (4, 30))) == 4  # a flat step, then a real gain
    assert slot_knee(_slots((1, 10), (2, 10.5), (4, 10.8))) == 1
    assert slot_knee(_slots((4, 30), (1, 10), (2, 18))) == 4  # order of the rows does not matter
    assert slot_knee(_slots((1, 10), (2, 20))) == 2


def test_flash_attention_is_turned_off_only_where_off_generates_10_percent_faster() -> None:
    on, off_faster, off_close = _slots((4, 40), (4, 44), (4, 43.9))
    assert flash_attn_choice(on, off_faster) == "off"
    assert flash_attn_choice(on, off_close) is None  # within noise: the build's default stays
    assert flash_attn_choice(off_faster, on) is None


@pytest.mark.slow
def test_tiny_sweep_names_the_knees_and_writes_json_table_and_chart(
    tmp_path: Path,
    model_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """With the tools of the configured server's own build, ik_llama.cpp's table output read."""
    calls = tmp_path / "calls.log"
    server = own_build(tmp_path / "build", calls)
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path))
    monkeypatch.setenv("KIMI_BATCH_MODEL", str(model_path))
    monkeypatch.setenv("KIMI_BATCH_LLAMA_SERVER", str(server))
    args = ["--threads", "1", "2", "--slots", "1", "2", "--prompt-tokens", "32"]
    args += ["--output-tokens", "8", "--repetitions", "1", "--ctx-per-slot", "256"]
    args += ["--digest-tokens", "96", "--tool-args", "-ngl 0"]

    assert main(["tune", *args]) == 0

    out = capsys.readouterr().out
    document = json.loads((tmp_path / "tune" / "tune.json").read_text())
    assert [p["threads"] for p in document["threads"]] == [1, 2]
    assert [p["slots"] for p in document["slots"]] == [1, 2]
    assert all(p["gen_tok_s"] > 0 and p["prompt_tok_s"] > 0 for p in document["threads"])
    assert all(p["gen_tok_s"] > 0 for p in document["slots"])
    # The sweeps run with the server's flash attention (the tests' servers: off).
    assert document["options"]["flash_attn"] == "off"
    assert all(p["flash_attn"] is False for p in [*document["threads"], *document["slots"]])
    assert document["thread_knee"] in (1, 2)
    assert document["slot_knee"] in (1, 2)
    assert f"KIMI_BATCH_LLAMA_THREADS={document['thread_knee']}" in out
    # Flash attention compared at the knees, over the digest-long shared prompt.
    attention = document["flash_attn"]
    assert set(attention) == {"on", "off"}
    assert all(p["gen_tok_s"] > 0 and p["prompt_tokens"] == 96 for p in attention.values())
    assert all(p["slots"] == document["slot_knee"] for p in attention.values())
    assert (attention["on"]["flash_attn"], attention["off"]["flash_attn"]) == (True, False)
    choice = document["flash_attn_choice"]
    assert choice in ("off", None)
    assert document["settings"].get("KIMI_BATCH_LLAMA_FLASH_ATTN") == choice
    assert (f"KIMI_BATCH_LLAMA_FLASH_ATTN={choice}" in out) == (choice is not None)
    assert (tmp_path / "tune" / "tune.png").read_bytes().startswith(b"\x89PNG")
    table = (tmp_path / "tune" / "tune.md").read_text()
    assert "| threads |" in table
    assert "| flash attention |" in table
    # Every sweep ran the tools beside the configured llama-server, and the output names them.
    assert document["tools"] == {
        name: str(server.with_name(name)) for name in ("llama-bench", "llama-batched-bench")
    }
    runs = calls.read_text().splitlines()
    assert {run.split()[0] for run in runs} == {"llama-bench", "llama-batched-bench"}
    assert all(run.endswith(" -ngl 0") for run in runs)  # --tool-args, last
    assert f"measured with: {server.with_name('llama-bench')}" in out
    speeds = json.loads((tmp_path / "tune" / "speeds.json").read_text())
    assert speeds["source"] == "tune"
    assert speeds["slots"] == document["slot_knee"]


def test_tool_args_with_an_unclosed_quote_are_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path))  # the embedded default model

    assert main(["tune", "--threads", "1", "--tool-args", "-ot 'exps=CPU"]) != 0

    error = capsys.readouterr().err.strip()
    assert "--tool-args" in error
    assert "No closing quotation" in error
    assert len(error.splitlines()) == 1
    assert not (tmp_path / "tune" / "tune.json").exists()
