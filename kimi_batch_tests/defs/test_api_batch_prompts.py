"""A Batch API batch whose lines bring their own system prompts runs as one engine batch through
the driver: every slot busy, each prompt in a slot once, no save file left; a batch past its
expiry lands what it has and ends `expired` (real instance, real server)."""

from __future__ import annotations

import json
import time
from typing import Any

import dagster as dg
import pytest

from kimi_batch.batch_api import ApiStore, BatchRecord, BatchStatus
from kimi_batch.settings import Settings, default_digest_path
from kimi_batch_tests.support.batches import MODEL, answered, chat_line, jsonl, landed_batch
from kimi_batch_tests.support.llama_server import TEST_SLOTS, LlamaEnv

pytestmark = pytest.mark.slow  # every test answers a batch on a real llama-server


def _line(custom_id: str, system: str) -> dict[str, Any]:
    messages = [
        {"role": "system", "content": system},
        {"role": "user", "content": f"Name one thing about {custom_id}."},
    ]
    body = {"model": MODEL, "messages": messages, "max_tokens": 4, "temperature": 0}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def _final(settings: Settings, batch: BatchRecord) -> tuple[BatchRecord, list[dict[str, Any]]]:
    """The batch's record and its error file's lines."""
    with ApiStore(settings.paths) as store:
        done = store.batch(batch.id)
        assert done is not None
        errors = store.file(done.error_file_id) if done.error_file_id else None
        text = store.blob_path(errors).read_text() if errors else ""
    return done, [json.loads(line) for line in text.splitlines()]


def test_lines_with_their_own_system_prompts_share_one_engine_batch(llama_env: LlamaEnv) -> None:
    settings = Settings.from_env()
    shared = f"You are the shared persona.\n{default_digest_path().read_text()[:1200]}"
    lines = [
        *(_line(f"oneoff{i}", f"You are persona number {i}. Be brief.") for i in range(12)),
        *(_line(f"shared{i}", shared) for i in range(TEST_SLOTS)),
    ]
    batch = landed_batch(settings, jsonl(*lines))

    with dg.instance_for_test() as instance:
        figures = answered(settings, instance, batch)
    done, errors = _final(settings, batch)

    assert done.status == BatchStatus.COMPLETED
    assert errors == []
    assert figures["generated"] == len(lines)
    assert figures["max_in_flight"] == TEST_SLOTS  # not one system prompt at a time
    assert figures["system_prompts"] == 13
    # The shared prompt: one warm-up, restored into the other slots; each one-off prompt is
    # prefilled by its one request.
    assert (figures["prompt_warmups"], figures["one_off_prompt_prefills"]) == (1, 12)
    assert figures["slot_saves_peak"] == 1
    assert list(settings.paths.slot_save_dir.glob("prompt-*")) == []


def test_a_batch_past_its_expiry_lands_what_it_has_and_ends_expired(llama_env: LlamaEnv) -> None:
    settings = Settings.from_env()
    batch = landed_batch(settings, jsonl(chat_line("late", max_tokens=4)))
    with ApiStore(settings.paths) as store:
        batch = store.update_batch(batch.id, expires_at=int(time.time()) - 1)

    with dg.instance_for_test() as instance:
        figures = answered(settings, instance, batch)
    done, errors = _final(settings, batch)

    assert figures["batch_status"] == "expired"
    assert (figures["generated"], figures["not_started"]) == (0, 1)
    assert done.status == BatchStatus.EXPIRED
    assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [("late", "batch_expired")]
