"""A tiny real `kimi-batch bench`: every contender, the contract's JSON keys, table and chart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kimi_batch.cli import main
from kimi_batch.settings import default_digest_path
from kimi_batch_bench_tests.own_build import own_build
from kimi_batch_tests.support.ports import free_port

TOP_LEVEL = {
    "naive_tok_s",
    "limit_tok_s",
    "engine_tok_s",
    "engine_over_limit",
    "engine_over_limit_incl_warmup",
    "engine_over_naive",
    "digest_reprefills",
    "orchestration_overhead_s",
    "peak_rss_mb",
}
AMPLIFY = {
    "limit_tok_s",
    "engine_tok_s",
    "engine_over_limit",
    "limit_prompt_tokens",
    "engine_prompt_tokens",
    "prompt_tokens_ratio",
}


def _bench_env(
    tmp_path: Path, llama_binary: Path, model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The shipped digest's opening (~160 tokens of its 1,185): every contender still starts its
    # requests with one digest, prefilled or restored, but the naive one's per-request prefill
    # and the warm-ups cost a seventh (the figures' sizes are not what these tests check).
    digest = tmp_path / "digest.md"
    shipped = default_digest_path().read_text(encoding="utf-8")
    digest.write_text(shipped.split("\n## Instructions blocks\n", 1)[0] + "\n", encoding="utf-8")
    for name, value in {
        "KIMI_BATCH_HOME": str(tmp_path / "home"),
        "KIMI_BATCH_DIGEST": str(digest),
        "KIMI_BATCH_MODEL": str(model_path),
        "KIMI_BATCH_LLAMA_SERVER": str(llama_binary),
        "KIMI_BATCH_LLAMA_PORT": str(free_port()),
        "KIMI_BATCH_LLAMA_THREADS": "2",
        "KIMI_BATCH_LLAMA_PARALLEL": "2",
        "KIMI_BATCH_LLAMA_CTX": str(2 * 2048),
    }.items():
        monkeypatch.setenv(name, value)
    for name in ("KIMI_BATCH_LLAMA_URL", "KIMI_BATCH_TRINO_HOST", "DAGSTER_HOME"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.slow
def test_tiny_bench_writes_the_contract_keys(
    tmp_path: Path,
    llama_binary: Path,
    model_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _bench_env(tmp_path, llama_binary, model_path, monkeypatch)
    calls = tmp_path / "calls.log"  # the ceiling runs the tool of the server's own build
    monkeypatch.setenv("KIMI_BATCH_LLAMA_SERVER", str(own_build(tmp_path / "build", calls)))
    out = tmp_path / "bench.json"
    sizes = ["--rows", "4", "--output-tokens", "8", "--seeds-per-slot", "1", "--variants", "1"]
    sizes += ["--amplify-output-tokens", "4", "--tool-args", "-ngl 0"]

    assert main(["bench", "--json", str(out), *sizes]) == 0

    document = json.loads(out.read_text())
    assert document.keys() >= TOP_LEVEL
    assert document["amplify"].keys() >= AMPLIFY
    assert set(document["distill"]["contenders"]) == {"naive", "all_slots", "engine", "dagster"}
    engine = document["distill"]["contenders"]["engine"]
    # --ignore-eos: every answer is exactly as long as asked, so tok/s compare.
    assert engine["completion_tokens"] == 4 * 8
    assert document["amplify"]["contenders"]["all_slots"]["completion_tokens"] == 6 * 4
    assert document["digest_reprefills"] == 0
    assert all(document[key] > 0 for key in ("naive_tok_s", "limit_tok_s", "engine_tok_s"))
    # 2 seeds x 3 strategies on 2 slots: grouped, each seed is evaluated once instead of twice.
    assert document["amplify"]["prompt_tokens_ratio"] < 1
    assert document["ceiling_tok_s"] > 0
    # The design's ratio of the engine to llama.cpp's own batched decode (found missing by audit).
    ceiling = document["distill"]["ceiling"]["gen_tok_s"]
    assert document["engine_over_ceiling"] == pytest.approx(
        document["engine_tok_s"] / ceiling, rel=0.01
    )
    # The ceiling decodes as the bench's server does (the tests' servers: flash attention off).
    assert document["config"]["flash_attn"] == "off"
    assert document["distill"]["ceiling"]["flash_attn"] is False
    ceilings = calls.read_text().splitlines()  # one a workload, --tool-args last
    assert len(ceilings) == 2
    assert all(run.startswith("llama-batched-bench ") for run in ceilings)
    assert all(run.endswith(" -ngl 0") for run in ceilings)
    assert "(C) engine" in out.with_suffix(".md").read_text()
    assert out.with_suffix(".png").read_bytes().startswith(b"\x89PNG")
    assert "(D) Dagster partition" in capsys.readouterr().out
    # The bench stops the server it started.
    assert not (tmp_path / "home" / "bench" / "state" / "server" / "server.pid").exists()


@pytest.mark.slow
def test_the_judge_workload_reports_its_cost_against_the_answers_in_one_run(
    tmp_path: Path, llama_binary: Path, model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _bench_env(tmp_path, llama_binary, model_path, monkeypatch)
    out = tmp_path / "judge.json"
    quick = ["--rows", "2", "--output-tokens", "16", "--no-dagster", "--no-ceiling"]

    assert main(["bench", "--workload", "judge", "--json", str(out), *quick]) == 0

    document = json.loads(out.read_text())
    judge, answers = document["judge"], document["distill"]
    assert judge["requests"] == answers["requests"] == 2
    # A verdict per answer, read after the rubric, the request and the answer.
    assert judge["contenders"]["engine"]["completion_tokens"] == 2 * judge["output_tokens"]
    assert judge["engine_prompt_tokens"] > answers["engine_prompt_tokens"]
    assert judge["judge_over_answer_wall"] > 0
