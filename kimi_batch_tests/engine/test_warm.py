"""The digest in every slot: one prefill, restores, canaries, restarts (real llama-server)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kimi_batch.engine.batch_engine import BatchEngine
from kimi_batch.engine.digest import SystemDigest
from kimi_batch.engine.ledger import Ledger
from kimi_batch.engine.prompt import assemble_messages
from kimi_batch.engine.warm import SlotWarmer, WarmupReport
from kimi_batch.llama import LlamaClient, LlamaError, RetryPolicy
from kimi_batch.llama.messages import ChatMessage
from kimi_batch.llama.server import ResidentServer
from kimi_batch_tests.support.engine import digest_tokens, endpoint_of, fresh_digest, questions
from kimi_batch_tests.support.llama_server import TEST_SLOTS, make_spec

pytestmark = pytest.mark.slow  # every test here talks to a real llama-server


async def test_one_prefill_then_restores_then_every_request_hits_the_digest(
    shared_server: ResidentServer, tmp_path: Path
) -> None:
    digest = fresh_digest("warm")
    tokens = await digest_tokens(shared_server, digest)
    async with shared_server.client() as client:
        warmer = SlotWarmer(client, digest, digest_tokens=tokens, model="m", ctx=2048)
        report = await warmer.warm_all(TEST_SLOTS)
    assert report.prefilled_slots == [0]
    assert report.restored_slots == list(range(1, TEST_SLOTS))
    assert report.slots_verified == TEST_SLOTS
    assert report.restore_ms_per_slot < report.prefill_ms

    with Ledger(tmp_path / "ledger.sqlite3") as ledger:
        engine = BatchEngine([endpoint_of(shared_server)], digest, ledger, digest_tokens=tokens)
        outcome = await engine.run(questions(4 * TEST_SLOTS), warm=False)
        rows = list(outcome.iter_results(ledger))
    assert len(rows) == 4 * TEST_SLOTS
    assert all(r.cached_tokens >= tokens for r in rows)
    assert outcome.stats.digest_reprefills == 0
    assert outcome.stats.max_in_flight == TEST_SLOTS
    assert outcome.stats.cache_hit_ratio == 1.0


async def test_one_changed_byte_costs_one_prefill_per_cold_slot_and_no_more(
    shared_server: ResidentServer, tmp_path: Path
) -> None:
    # Its first sections: five prefills of the whole digest cost ~20 s here, and what is
    # asserted is how many there are.
    old = fresh_digest("before", sections=2)
    # One byte, at the front: nothing of the old prefix can be reused.
    changed = SystemDigest.from_text(old.text.replace("Teacher", "teacher", 1))
    assert changed.sha256 != old.sha256
    assert changed.n_bytes == old.n_bytes
    tokens = await digest_tokens(shared_server, changed)
    async with shared_server.client() as client:
        await SlotWarmer(client, old, digest_tokens=tokens, model="m", ctx=2048).warm_all(
            TEST_SLOTS, verify=False
        )
    with Ledger(tmp_path / "ledger.sqlite3") as ledger:
        engine = BatchEngine([endpoint_of(shared_server)], changed, ledger, digest_tokens=tokens)
        # Without warming, the first request on each slot meets the old digest: a full prefill.
        first = await engine.run(questions(TEST_SLOTS, "first"), warm=False)
        second = await engine.run(questions(2 * TEST_SLOTS, "second"), warm=False)
        first_rows = list(first.iter_results(ledger))
        second_rows = list(second.iter_results(ledger))
    assert first.stats.digest_reprefills == TEST_SLOTS
    assert {r.slot_id for r in first_rows} == set(range(TEST_SLOTS))
    assert second.stats.digest_reprefills == 0
    assert all(r.cached_tokens >= tokens for r in second_rows)
    assert all(r.cached_tokens < tokens * 0.05 for r in first_rows)


async def test_changing_the_user_message_keeps_the_cached_prefix(
    shared_server: ResidentServer,
) -> None:
    digest = fresh_digest("user")
    tokens = await digest_tokens(shared_server, digest)
    async with shared_server.client() as client:
        await SlotWarmer(client, digest, digest_tokens=tokens, model="m", ctx=2048).warm_all(
            TEST_SLOTS, verify=False
        )
        cached = []
        for question in ("What is rain?", "Explain photosynthesis in one line, please."):
            messages = assemble_messages(digest, [ChatMessage(role="user", content=question)])
            completion = await client.chat(messages, max_tokens=4, temperature=0.0, slot_id=1)
            cached.append(completion.stats.cached_tokens)
    assert cached[0] == cached[1]
    assert cached[0] >= tokens


@pytest.fixture
def own_server(tmp_path: Path, llama_binary: Path, model_path: Path) -> Iterator[ResidentServer]:
    spec = make_spec(llama_binary, model_path, tmp_path, parallel=2, ctx=2 * 2048)
    server = ResidentServer(spec, tmp_path / "server", load_timeout_s=300)
    server.ensure_running()
    yield server
    server.stop()


async def test_after_a_restart_the_digest_is_restored_from_file_not_prefilled(
    own_server: ResidentServer,
) -> None:
    digest = fresh_digest("restart")
    tokens = await digest_tokens(own_server, digest)

    async def warm() -> WarmupReport:
        async with own_server.client() as client:
            return await SlotWarmer(
                client,
                digest,
                digest_tokens=tokens,
                model="m",
                ctx=2048,
                # As the resident server's runs do: the save is looked for before a restore.
                save_dir=own_server.spec.slot_save_path,
            ).warm_all(2)

    before = await warm()
    own_server.stop()
    assert own_server.ensure_running().spawned is True
    after = await warm()
    assert before.prefilled_slots == [0]
    assert after.prefilled_slots == []
    assert after.restored_slots == [0, 1]
    first_canary = after.canaries[0]
    assert first_canary.warm
    assert first_canary.evaluated_tokens < tokens * 0.05
    assert after.restore_ms < before.prefill_ms


async def test_a_restore_whose_save_file_is_not_there_is_not_asked_for(tmp_path: Path) -> None:
    """ik_llama.cpp's server never answers a restore of a missing file: each would cost a
    timeout. Nothing listens on this client's port: a request would fail the restore."""
    digest = fresh_digest("no save")
    async with LlamaClient("http://127.0.0.1:9", retry=RetryPolicy(attempts=1)) as client:
        warmer = SlotWarmer(
            client, digest, digest_tokens=10, model="m", ctx=2048, save_dir=tmp_path
        )
        assert await warmer.restore(0) is None
        (tmp_path / warmer.save_name).write_bytes(b"saved")
        with pytest.raises(LlamaError):
            await warmer.restore(0)
