"""Requests with their own system digest in one engine batch (Batch API lines): every slot busy,
one prefill per shared digest, the batch's save files bounded and gone (real llama-server)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from pathlib import Path

import pytest

from kimi_batch.engine.batch_engine import BatchEngine
from kimi_batch.engine.digest import SystemDigest, load_digest
from kimi_batch.engine.generation import GenerationRequest
from kimi_batch.engine.ledger import Ledger
from kimi_batch.engine.outcome import BatchOutcome, EnginePolicy
from kimi_batch.llama.server import ResidentServer
from kimi_batch.settings import default_digest_path
from kimi_batch_tests.support.engine import (
    digest_tokens,
    endpoint_of,
    fresh_digest,
    questions,
    server_tasks,
)
from kimi_batch_tests.support.llama_server import TEST_SLOTS

pytestmark = pytest.mark.slow  # every test runs the engine on a real llama-server


def _persona(name: str, *, long: bool) -> SystemDigest:
    """A system prompt that differs from the others from its first token (no shared prefix);
    `long`: the start of the shipped digest after it (~300 tokens: a prefill that shows)."""
    body = load_digest(default_digest_path()).text[:1200] if long else "Answer in one line.\n"
    return SystemDigest.from_text(f"You are persona {name}.\n{body}")


def _with_digest(
    requests: Sequence[GenerationRequest], digest: SystemDigest
) -> list[GenerationRequest]:
    return [request.model_copy(update={"digest": digest}) for request in requests]


def _prompt_saves(server: ResidentServer) -> set[str]:
    return {path.name for path in server.spec.slot_save_path.glob("prompt-*")}


async def _run(
    server: ResidentServer,
    ledger: Ledger,
    requests: Sequence[GenerationRequest],
    *,
    engine_digest: SystemDigest,
    policy: EnginePolicy | None = None,
) -> BatchOutcome:
    tokens = await digest_tokens(server, engine_digest)
    engine = BatchEngine(
        [endpoint_of(server)], engine_digest, ledger, digest_tokens=tokens, policy=policy
    )
    return await engine.run(requests)


async def test_one_off_system_prompts_keep_every_slot_busy_and_save_nothing(
    shared_server: ResidentServer, tmp_path: Path
) -> None:
    prompts = [_persona(f"one-off {i}", long=False) for i in range(3 * TEST_SLOTS)]
    requests = [
        _with_digest([request], prompt)[0]
        for request, prompt in zip(questions(len(prompts), "oneoff"), prompts, strict=True)
    ]

    with Ledger(tmp_path / "ledger.sqlite3") as ledger:
        outcome = await _run(shared_server, ledger, requests, engine_digest=fresh_digest("unused"))
        rows = list(outcome.iter_results(ledger))

    stats = outcome.stats
    assert outcome.failures == []
    assert stats.max_in_flight == TEST_SLOTS  # not one group at a time
    # Each prompt is prefilled by its one request: no warm-up, no save, no restore.
    assert (stats.own_digest_prefills, stats.digest_warmups, stats.digest_restores) == (12, 0, 0)
    assert stats.slot_saves_peak == 0
    assert outcome.warmups == []  # no request uses the engine's digest: it is not warmed
    assert [row.digest_sha256 for row in rows] == [p.sha256 for p in prompts]
    assert _prompt_saves(shared_server) == set()


async def test_a_shared_system_prompt_is_prefilled_once_and_restored_into_the_other_slots(
    shared_server: ResidentServer, tmp_path: Path
) -> None:
    prompts = [_persona(name, long=True) for name in ("Ada", "Grace", "Edsger")]
    requests = [
        request
        for i, prompt in enumerate(prompts)
        for request in _with_digest(questions(TEST_SLOTS, f"shared{i}-"), prompt)
    ]
    tokens = {p.sha256: await digest_tokens(shared_server, p) for p in prompts}
    before = server_tasks(shared_server)

    with Ledger(tmp_path / "ledger.sqlite3") as ledger:
        outcome = await _run(shared_server, ledger, requests, engine_digest=fresh_digest("unused"))
        rows = list(outcome.iter_results(ledger))

    stats = outcome.stats
    assert outcome.failures == []
    assert stats.max_in_flight == TEST_SLOTS
    # One prefill per prompt (its warm-up), on the server as in the engine's figures.
    assert stats.digest_warmups == len(prompts)
    assert server_tasks(shared_server) - before == len(requests) + len(prompts)
    assert stats.digest_restores == len(requests) - len(prompts)
    assert stats.own_digest_prefills == 0
    assert all(row.cached_tokens >= tokens[row.digest_sha256] for row in rows), [
        (row.cached_tokens, tokens[row.digest_sha256]) for row in rows
    ]
    assert stats.cache_hit_ratio == 1.0
    assert _prompt_saves(shared_server) == set()  # each removed with its prompt's last request


async def test_the_batch_s_saves_stay_within_the_bound_and_the_pipeline_digest_s_stays(
    shared_server: ResidentServer, tmp_path: Path
) -> None:
    engine_digest = _persona(f"pipeline {uuid.uuid4().hex}", long=True)  # no save of it yet
    prompts = [_persona(name, long=True) for name in ("Alan", "Barbara", "Claude")]
    requests = questions(TEST_SLOTS, "pipeline") + [
        request
        for i, prompt in enumerate(prompts)
        for request in _with_digest(questions(TEST_SLOTS, f"bound{i}-"), prompt)
    ]
    seen: list[int] = []

    async def watch_folder() -> None:
        while True:
            seen.append(len(_prompt_saves(shared_server)))
            await asyncio.sleep(0.01)

    watcher = asyncio.create_task(watch_folder())
    with Ledger(tmp_path / "ledger.sqlite3") as ledger:
        outcome = await _run(
            shared_server,
            ledger,
            requests,
            engine_digest=engine_digest,
            policy=EnginePolicy(slot_saves_max=1),
        )
    watcher.cancel()

    assert outcome.failures == []
    assert outcome.stats.generated == len(requests)
    assert outcome.stats.slot_saves_peak == 1
    assert max(seen) <= 1, seen  # on disk, at every moment
    assert _prompt_saves(shared_server) == set()
    [warmup] = outcome.warmups  # the pipeline digest's save is kept for restarts
    assert (shared_server.spec.slot_save_path / warmup.save_name).is_file()
