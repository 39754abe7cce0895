"""The batch engine on real llama-servers: scale-out, resume from the ledger, bad requests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kimi_batch.engine.digest import SystemDigest
from kimi_batch.engine.ledger import Ledger
from kimi_batch.engine.requests import GenerationRequest, SamplingParams
from kimi_batch.engine.runner import BatchEngine
from kimi_batch.llama.server import ResidentServer
from kimi_batch.llama.types import ChatMessage
from kimi_batch_tests.conftest import make_spec
from kimi_batch_tests.engine.test_warm import digest_tokens, endpoint_of, fresh_digest, questions


def server_tasks(server: ResidentServer) -> int:
    """Completions the server processed, counted from its own log."""
    return server.log_path.read_text(errors="replace").count("launch_slot_: id")


@pytest.fixture
def two_servers(
    tmp_path: Path, llama_binary: Path, model_path: Path
) -> Iterator[tuple[ResidentServer, ResidentServer]]:
    servers = []
    for name in ("a", "b"):
        home = tmp_path / name
        spec = make_spec(llama_binary, model_path, home, parallel=2, ctx=2 * 2048)
        server = ResidentServer(spec, home / "server", load_timeout_s=300)
        server.ensure_running()
        servers.append(server)
    yield servers[0], servers[1]
    for server in servers:
        server.stop()


async def test_two_servers_share_the_rows_and_give_the_one_server_result(
    two_servers: tuple[ResidentServer, ResidentServer], tmp_path: Path
) -> None:
    first, second = two_servers
    digest = fresh_digest("scale")
    tokens = await digest_tokens(first, digest)
    requests = questions(12, "scale")

    with Ledger(tmp_path / "two.sqlite3") as ledger:
        outcome = await BatchEngine(
            [endpoint_of(first), endpoint_of(second)], digest, ledger, digest_tokens=tokens
        ).run(requests)
        both = list(outcome.iter_results(ledger))
    with Ledger(tmp_path / "one.sqlite3") as ledger:
        outcome_alone = await BatchEngine(
            [endpoint_of(first)], digest, ledger, digest_tokens=tokens
        ).run(requests)
        alone = list(outcome_alone.iter_results(ledger))

    used = {r.endpoint for r in both}
    assert used == {first.base_url, second.base_url}
    assert outcome.stats.max_in_flight <= 4
    # Every request once, in request order, with the ids one server gives. The texts are not
    # compared: llama.cpp's batched kernels make greedy text depend on the batch composition.
    assert [r.request_id for r in both] == [r.request_id for r in alone]
    assert [r.input_id for r in both] == [r.input_id for r in requests]
    assert all(r.cached_tokens >= tokens for r in both)


async def test_a_rerun_sends_only_what_the_ledger_lacks(
    shared_server: ResidentServer, tmp_path: Path
) -> None:
    digest = fresh_digest("resume")
    tokens = await digest_tokens(shared_server, digest)
    endpoint = endpoint_of(shared_server)
    requests = questions(6, "resume")
    with Ledger(tmp_path / "ledger.sqlite3") as ledger:
        engine = BatchEngine([endpoint], digest, ledger, digest_tokens=tokens)
        await engine.run(requests[:4])
        before = server_tasks(shared_server)
        outcome = await engine.run(requests)
        sent = server_tasks(shared_server) - before
        rows = list(outcome.iter_results(ledger))
    assert outcome.stats.from_ledger == 4
    assert outcome.stats.generated == 2
    assert sent == 2
    assert len({r.request_id for r in rows}) == 6


async def test_two_inputs_asking_the_same_thing_are_generated_once_but_stay_two_rows(
    shared_server: ResidentServer, tmp_path: Path
) -> None:
    digest = fresh_digest("same")
    tokens = await digest_tokens(shared_server, digest)
    message = [ChatMessage(role="user", content="Name a prime number.")]
    params = SamplingParams(max_tokens=6, temperature=0.0)
    requests = [
        GenerationRequest(input_id="x", messages=message, params=params),
        GenerationRequest(input_id="y", messages=message, params=params),
    ]
    with Ledger(tmp_path / "ledger.sqlite3") as ledger:
        outcome = await BatchEngine(
            [endpoint_of(shared_server)], digest, ledger, digest_tokens=tokens
        ).run(requests)
        rows = list(outcome.iter_results(ledger, chunk_size=1))
    assert outcome.stats.generated == 1
    assert [r.input_id for r in rows] == ["x", "y"]
    assert len({r.request_id for r in rows}) == 2
    assert rows[0].text == rows[1].text


async def test_a_request_the_server_rejects_fails_alone_and_is_not_recorded(
    shared_server: ResidentServer, tmp_path: Path
) -> None:
    digest = SystemDigest.from_text("You answer briefly.\n")
    tokens = await digest_tokens(shared_server, digest)
    too_long = GenerationRequest(
        input_id="long",
        messages=[ChatMessage(role="user", content="word " * 5000)],
        params=SamplingParams(max_tokens=4),
    )
    good = questions(2, "fine")
    with Ledger(tmp_path / "ledger.sqlite3") as ledger:
        outcome = await BatchEngine(
            [endpoint_of(shared_server)], digest, ledger, digest_tokens=tokens
        ).run([too_long, *good])
        assert ledger.count() == 2
        rows = list(outcome.iter_results(ledger))
    assert [f.input_id for f in outcome.failures] == ["long"]
    assert "rejected by the server" in outcome.failures[0].reason
    assert [r.input_id for r in rows] == ["fine0", "fine1"]


async def test_max_tokens_above_the_server_cap_is_clamped(
    shared_server: ResidentServer, tmp_path: Path
) -> None:
    digest = fresh_digest("clamp")
    tokens = await digest_tokens(shared_server, digest)
    endpoint = endpoint_of(shared_server)
    request = GenerationRequest(
        input_id="big",
        messages=[ChatMessage(role="user", content="Count from one to three.")],
        params=SamplingParams(max_tokens=endpoint.n_predict * 4, temperature=0.0),
    )
    with Ledger(tmp_path / "ledger.sqlite3") as ledger:
        engine = BatchEngine([endpoint], digest, ledger, digest_tokens=tokens)
        planned = engine.plan([request])
        outcome = await engine.run([request])
    assert planned[0].params.max_tokens == endpoint.n_predict
    assert outcome.stats.clamped == 1
