"""The api-prompts workload's file: valid Batch API lines, each with a system prompt of its own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kimi_batch.batch_api import ApiStore
from kimi_batch.settings import Settings
from kimi_batch_bench.api_prompts import _landed_batch, api_prompt_lines
from kimi_batch_tests.support.batches import MODEL


def test_every_line_lands_with_a_system_prompt_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path / "home"))
    settings = Settings.from_env()
    data = api_prompt_lines(12, model=MODEL, max_tokens=4)
    batch_id = _landed_batch(settings, data)
    with ApiStore(settings.paths) as store:
        batch = store.batch(batch_id)
    assert batch is not None
    assert batch.request_total == 12
    assert not batch.errors
    systems = [json.loads(line)["body"]["messages"][0]["content"] for line in data.splitlines()]
    assert len(set(systems)) == 12
    # No two share more than their first word: no line can reuse another's prompt in the cache.
    assert len({" ".join(system.split()[:2]) for system in systems}) == 12
