"""The generation assets' defaults: the answer budget and the truncation check (no server)."""

from __future__ import annotations

import dagster as dg
import pytest

from kimi_batch.defs.assets.stage_asset import generation_checks
from kimi_batch.pipeline import AmplifyConfig, CheckFigures, DistillConfig
from kimi_batch.settings import Settings
from kimi_batch.warehouse import polars_schema


def test_the_answer_budget_defaults_to_the_servers_n_predict(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A reasoning model thinks for hundreds of tokens first: 256 would cut most answers off.
    # The default, not the session server's setting (the llama_env fixture sets the variable).
    monkeypatch.delenv("KIMI_BATCH_LLAMA_N_PREDICT", raising=False)
    n_predict = Settings.from_env().llama_n_predict

    assert n_predict == 1024
    assert DistillConfig().sampling(n_predict).max_tokens == 1024
    assert DistillConfig(max_tokens=64).sampling(n_predict).max_tokens == 64


def test_a_variants_budget_is_128_tokens_or_the_servers_smaller_n_predict(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # llama-server lets a request's max_tokens run past its --n-predict: the cap is the task's.
    monkeypatch.delenv("KIMI_BATCH_LLAMA_N_PREDICT", raising=False)
    settings = Settings.from_env()
    small = settings.model_copy(update={"llama_n_predict": 8})

    assert AmplifyConfig().task(settings).params.max_tokens == 128
    assert AmplifyConfig().task(small).params.max_tokens == 8
    assert AmplifyConfig(max_tokens=64).task(small).params.max_tokens == 64


def test_a_partition_with_many_answers_cut_off_fails_its_truncation_check() -> None:
    # The held-out run: 39 of 82 answers set aside at max_tokens.
    figures = CheckFigures(results=82, truncated=39, empty=0, rows=43, duplicate_request_ids=0)

    checks = generation_checks("distilled", figures, polars_schema("distilled"))

    (truncation,) = [c for c in checks if c.check_name == "truncation_rate"]
    assert not truncation.passed
    assert truncation.severity == dg.AssetCheckSeverity.ERROR
    assert truncation.metadata["rate"] == dg.MetadataValue.float(0.476)
