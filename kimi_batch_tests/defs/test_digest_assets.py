"""`system_digest` and `digest_prefill` materialized on a real instance against the real server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from kimi_batch.definitions import DIGEST_ASSETS, build_resources
from kimi_batch.settings import Settings
from kimi_batch_tests.support.engine import fresh_digest
from kimi_batch_tests.support.llama_server import TEST_CTX, TEST_N_PREDICT, TEST_SLOTS, LlamaEnv

pytestmark = pytest.mark.slow  # every test warms a real llama-server


def _metadata(result: dg.ExecuteInProcessResult, asset: str) -> dict[str, Any]:
    (materialization,) = result.asset_materializations_for_node(asset)
    return {key: value.value for key, value in materialization.metadata.items()}


def _digest_file(home: Path, name: str) -> Path:
    path = home / f"{name}.md"
    path.write_text(fresh_digest(name).text, encoding="utf-8")
    return path


def _materialize(digest_path: Path) -> dg.ExecuteInProcessResult:
    with pytest.MonkeyPatch.context() as patch, dg.instance_for_test() as instance:
        patch.setenv("KIMI_BATCH_DIGEST", str(digest_path))  # deployment config, not run config
        return dg.materialize(
            DIGEST_ASSETS, resources=build_resources(Settings.from_env()), instance=instance
        )


def test_digest_is_fingerprinted_then_prefilled_once_and_restored_everywhere(
    llama_env: LlamaEnv,
) -> None:
    result = _materialize(_digest_file(llama_env.home, "assets"))
    assert result.success
    digest = _metadata(result, "system_digest")
    prefill = _metadata(result, "digest_prefill")
    assert len(digest["sha256"]) == 64
    assert digest["tokens"] > 1000
    assert prefill["digest_sha256"] == digest["sha256"]
    assert prefill["prefills"] == 1
    assert prefill["restores"] == llama_env.slots - 1
    assert prefill["slots_verified"] == llama_env.slots
    assert prefill["min_cached_tokens"] >= digest["tokens"]
    assert 0 < prefill["restore_ms_per_slot"] < prefill["prefill_ms"]
    (check,) = result.get_asset_check_evaluations()
    assert check.passed


def test_after_a_server_restart_the_digest_comes_back_from_the_save_file(
    llama_env: LlamaEnv,
) -> None:
    digest_path = _digest_file(llama_env.home, "restart")
    first = _materialize(digest_path)
    assert _metadata(first, "digest_prefill")["prefills"] == 1

    llama_env.server.stop()
    second = _materialize(digest_path)  # the resource respawns the server
    prefill = _metadata(second, "digest_prefill")
    assert prefill["prefills"] == 0
    assert prefill["restores"] == llama_env.slots
    assert prefill["slots_verified"] == llama_env.slots
    assert prefill["restore_ms"] > 0
    assert prefill["prefill_ms"] == 0


def test_a_digest_with_a_timestamp_or_uuid_fails_with_the_line(llama_env: LlamaEnv) -> None:
    bad = llama_env.home / "bad-digest.md"
    bad.write_text(
        "You are a teacher.\nContext as of 2026-11-30 10:00.\n"
        "Trace 3f2b8c1e-9a4d-4e6f-8b2a-1c3d5e7f9a0b.\n",
        encoding="utf-8",
    )
    with pytest.raises(dg.Failure) as failure:
        _materialize(bad)
    message = str(failure.value)
    assert "line 2: datetime '2026-11-30 10:00'" in message
    assert "line 3: uuid" in message


def test_a_digest_its_slots_cannot_hold_with_a_question_and_an_answer_is_refused(
    llama_env: LlamaEnv,
) -> None:
    # Three copies of the ~1.1k-token digest in slots of 2,048 tokens (8,192 over 4).
    path = llama_env.home / "too-long.md"
    path.write_text(fresh_digest("too-long").text * 3, encoding="utf-8")
    with pytest.MonkeyPatch.context() as patch, dg.instance_for_test() as instance:
        patch.setenv("KIMI_BATCH_DIGEST", str(path))
        result = dg.materialize(
            DIGEST_ASSETS,
            resources=build_resources(Settings.from_env()),
            instance=instance,
            raise_on_error=False,
        )
    assert not result.success
    (failure,) = result.get_step_failure_events()
    error = failure.step_failure_data.error
    assert error is not None
    assert "a slot cannot hold digest " in error.message
    assert f"+ prompt 256 + answer {TEST_N_PREDICT} = " in error.message
    assert f"a slot holds {TEST_CTX // TEST_SLOTS:,} (context {TEST_CTX:,} over 4 slots)" in (
        error.message
    )
    assert "set KIMI_BATCH_LLAMA_CTX to at least" in error.message
    assert not result.asset_materializations_for_node("digest_prefill")
