"""`plan` arithmetic and the command (no server)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from kimi_batch.cli import main
from kimi_batch_bench.plan import PlanInput, Speeds, plan_partition, save_speeds
from kimi_batch_bench.speed_model import TargetProfile


def test_reproduces_the_source_documents_16k_prefill() -> None:
    result = plan_partition(
        PlanInput(prompt_tokens=16148, output_tokens=0, rows=1, prompt_tok_s=6.15, gen_tok_s=10)
    )

    assert round(result.minutes, 1) == 43.8


def test_slots_run_their_share_of_rows_one_after_another() -> None:
    spec = PlanInput(
        prompt_tokens=100, output_tokens=50, rows=10, prompt_tok_s=50, gen_tok_s=10, slots=4
    )
    result = plan_partition(spec)

    assert result.row_s == pytest.approx(2 + 5)
    assert result.wall_s == pytest.approx(3 * 7)  # ceil(10 / 4) rows on the busiest slot
    assert result.tokens_generated == 500


def test_window_gives_fit_and_the_largest_partition_that_fits() -> None:
    spec = PlanInput(
        prompt_tokens=0,
        output_tokens=3600,
        rows=20,
        prompt_tok_s=1,
        gen_tok_s=1,
        slots=2,
        window_h=8,
        digest_tokens=0,
    )
    result = plan_partition(spec)

    assert result.wall_s == 10 * 3600
    assert not result.fits
    assert result.max_rows_in_window == 16
    assert plan_partition(spec.model_copy(update={"rows": 16})).fits


def test_a_cold_digest_prefill_is_paid_once() -> None:
    spec = PlanInput(
        prompt_tokens=10, output_tokens=0, rows=4, prompt_tok_s=10, gen_tok_s=1, digest_tokens=100
    )

    assert plan_partition(spec).wall_s == pytest.approx(10 + 4)


def test_command_prints_minutes_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", "--prompt-tokens", "16148", "--output-tokens", "0", "--rows", "1"]
    # A 16k-token prompt after the digest needs more than the default context in its slot.
    speeds = ["--prompt-tok-s", "6.15", "--gen-tok-s", "10", "--ctx", "32768"]

    assert main([*args, *speeds]) == 0
    assert "43.8 min" in capsys.readouterr().out
    assert main([*args, *speeds, "--json"]) == 0
    assert math.isclose(json.loads(capsys.readouterr().out)["minutes"], 43.76, abs_tol=0.01)


def test_command_reads_the_newest_measured_speeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path))
    args = ["plan", "--prompt-tokens", "100", "--output-tokens", "10", "--rows", "8", "--json"]

    assert main(args) == 2
    assert "run `kimi-batch bench`" in capsys.readouterr().err

    save_speeds(tmp_path / "bench", Speeds(prompt_tok_s=100, gen_tok_s=10, slots=4, source="bench"))
    assert main(args) == 0
    planned = json.loads(capsys.readouterr().out)
    assert planned["inputs"]["slots"] == 4
    assert planned["wall_s"] == pytest.approx(2 * (1 + 1))


def test_command_refuses_a_bad_value_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", "--prompt-tokens", "-1", "--output-tokens", "1", "--rows", "1"]

    assert main([*args, "--prompt-tok-s", "1", "--gen-tok-s", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "prompt_tokens" in err


def test_command_plans_the_configured_answer_budget_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Without --output-tokens an answer is as long as the distillation may make it: n_predict.
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path))
    monkeypatch.setenv("KIMI_BATCH_LLAMA_N_PREDICT", "512")
    args = ["plan", "--prompt-tokens", "100", "--rows", "1", "--json"]

    assert main([*args, "--prompt-tok-s", "100", "--gen-tok-s", "8"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert planned["inputs"]["output_tokens"] == 512
    assert planned["wall_s"] == pytest.approx(1 + 512 / 8)


def test_a_night_pays_its_overhead_once_each_partition_its_own_and_the_window_cuts_it() -> None:
    spec = PlanInput(
        prompt_tokens=0,
        output_tokens=100,
        rows=40,
        prompt_tok_s=1,
        gen_tok_s=1,
        slots=4,
        window_h=1.0,
        partitions=4,
        night_overhead_s=300,
        partition_overhead_s=50,
    )
    result = plan_partition(spec)

    # One run: 300 s, 4 x 50 s, then the 40 rows in one batch = 10 rounds of 100 s.
    assert result.wall_s == pytest.approx(300 + 4 * 50 + 10 * 100)
    assert result.rows_in_window == 40
    # A round does not wait for a partition's end: 10 rows each, 5 rounds = 20 rows.
    tight = plan_partition(spec.model_copy(update={"window_h": 1000 / 3600}))
    assert tight.rows_in_window == 20
    cut = plan_partition(spec.model_copy(update={"window_h": 900 / 3600}))
    # 500 s idle, 4 rounds: 16 rows (partition 1 and 6 of partition 2).
    assert cut.rows_in_window == 16
    assert cut.rows_left == 24
    # Night 2: 300 s + 3 partitions with rows left x 50 s, 450 s left: 4 rounds. Night 3: the
    # last partition's 8 rows after 300 + 50 s.
    assert cut.next_night_rows == 16
    assert cut.nights_needed == 3
    # A window no round fits in after the overhead: never done.
    never = plan_partition(spec.model_copy(update={"window_h": 550 / 3600}))
    assert never.rows_in_window == 0
    assert never.nights_needed is None


def test_on_the_target_model_every_decode_step_is_slower_than_the_last() -> None:
    profile = TargetProfile()
    spec = PlanInput(
        prompt_tokens=50,
        output_tokens=1000,
        rows=8,
        target=profile,
        context_tokens=8000,
        slots=4,
    )
    result = plan_partition(spec)

    # Two rounds of 4: four prompts after the 8k digest, then 1,000 steps from 8,050 to 9,049.
    steps = sum(profile.decode_step_cost([8050 + k] * 4) for k in range(1000))
    assert result.row_s == pytest.approx(4 * profile.prefill_cost(8000, 50) + steps)
    assert result.wall_s == pytest.approx(2 * result.row_s)
    # Slower than at the first step, faster than at the last.
    first, last = profile.decode_step_cost([8050] * 4), profile.decode_step_cost([9049] * 4)
    assert 1 / last < result.gen_tok_s < 1 / first
    # A longer digest: the same rows take longer.
    longer = plan_partition(spec.model_copy(update={"context_tokens": 16000}))
    assert longer.wall_s > result.wall_s * 1.3


def test_on_the_target_model_the_last_round_has_the_rows_left_over() -> None:
    profile = TargetProfile()
    spec = PlanInput(prompt_tokens=20, output_tokens=100, rows=5, target=profile, slots=4)

    expected = profile.round_s(0, 20, 100, 4) + profile.round_s(0, 20, 100, 1)
    assert plan_partition(spec).wall_s == pytest.approx(expected)


def test_speeds_or_the_target_model_are_required() -> None:
    with pytest.raises(ValueError, match="prompt_tok_s and gen_tok_s"):
        PlanInput(prompt_tokens=1, output_tokens=1, rows=1)


def test_command_plans_on_the_target_model(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["plan", "--target", "--prompt-tokens", "16148", "--output-tokens", "0", "--rows", "1"]
    args += ["--ctx", "65536"]  # 3 slots of a 16k-token prompt after the digest

    assert main([*args, "--slots", "1", "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert planned["minutes"] == pytest.approx(43.8, rel=0.02)
    assert planned["inputs"]["target"]["name"] == TargetProfile().name
    # Without --slots: the deployment's slots.
    monkeypatch.setenv("KIMI_BATCH_LLAMA_PARALLEL", "3")
    assert main([*args, "--rows", "3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["inputs"]["slots"] == 3


def test_command_refuses_a_digest_prompt_and_answer_a_slot_cannot_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The target: a 16,148-token digest cached before each row, 512-token prompts, 1,024-token
    # answers, on the default context (16,384 tokens over 4 slots).
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path))
    for name in ("KIMI_BATCH_LLAMA_CTX", "KIMI_BATCH_LLAMA_PARALLEL"):
        monkeypatch.delenv(name, raising=False)
    args = ["plan", "--target", "--context-tokens", "16148", "--prompt-tokens", "512"]
    args += ["--output-tokens", "1024", "--rows", "100"]

    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "digest 16,148 + prompt 512 + answer 1,024 = 17,684 tokens" in err
    assert "a slot holds 4,096 (context 16,384 over 4 slots)" in err
    assert "--ctx (KIMI_BATCH_LLAMA_CTX) of at least 71680" in err

    assert main([*args, "--ctx", "71680", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["inputs"]["slots"] == 4


def test_a_judged_row_costs_its_verdict_after_its_answer() -> None:
    answers = PlanInput(
        prompt_tokens=100, output_tokens=50, rows=10, prompt_tok_s=50, gen_tok_s=10, slots=4
    )
    judged = answers.model_copy(update={"judge_prompt_tokens": 400, "judge_output_tokens": 20})
    alone, with_judge = plan_partition(answers), plan_partition(judged)

    # A verdict reads the rubric, the request and the answer (8 s), then writes 20 tokens (2 s).
    assert with_judge.row_s == pytest.approx(7 + 8 + 2)
    assert with_judge.judge_s == pytest.approx(3 * 10)
    assert with_judge.wall_s == pytest.approx(alone.wall_s + with_judge.judge_s)
    assert alone.judge_s == 0
    assert with_judge.tokens_generated == 10 * (50 + 20)


def test_command_reports_the_judge_stages_share(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", "--prompt-tokens", "200", "--output-tokens", "300", "--rows", "100"]
    speeds = ["--prompt-tok-s", "50", "--gen-tok-s", "10", "--slots", "2"]

    assert main([*args, *speeds, "--json"]) == 0
    alone = json.loads(capsys.readouterr().out)
    assert main([*args, *speeds, "--judge", "--json"]) == 0
    judged = json.loads(capsys.readouterr().out)
    # The judge reads the rubric, the 200-token request and the 300-token answer.
    assert judged["inputs"]["judge_prompt_tokens"] > 500
    assert judged["wall_s"] == pytest.approx(alone["wall_s"] + judged["judge_s"])
    assert main([*args, *speeds, "--judge"]) == 0
    assert "the judge stage" in capsys.readouterr().out
