"""The batch engine on real llama-servers: scale-out, resume from the ledger, bad requests."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from kimi_batch.engine.batch_engine import BatchEngine
from kimi_batch.engine.digest import SystemDigest
from kimi_batch.engine.generation import GenerationRequest, SamplingParams
from kimi_batch.engine.ledger import Ledger
from kimi_batch.engine.warm import SlotWarmer
from kimi_batch.llama.messages import ChatMessage
from kimi_batch.llama.server import ResidentServer
from kimi_batch_tests.support.engine import (
    digest_tokens,
    endpoint_of,
    fresh_digest,
    questions,
    server_tasks,
)
from kimi_batch_tests.support.llama_server import make_spec

pytestmark = pytest.mark.slow  # every test runs the engine on a real llama-server


@pytest.fixture
def two_servers(
    tmp_path: Path, llama_binary: Path, model_path: Path
) -> Iterator[tuple[ResidentServer, ResidentServer]]:
    servers = []
    for name in ("a", "b"):
        home = tmp_path / name
        spec = make_spec(llama_binary, model_path, home, parallel=2, ctx=2 * 2048, threads=1)
        server = ResidentServer(spec, home / "server", load_timeout_s=300)
        server.ensure_running()
        servers.append(server)
    yield servers[0], servers[1]
    for server in servers:
        server.stop()


async def test_two_servers_share_the_rows_and_send_each_request_once(
    two_servers: tuple[ResidentServer, ResidentServer], tmp_path: Path
) -> None:
    first, second = two_servers
    digest = fresh_digest("scale")
    tokens = await digest_tokens(first, digest)
    for server in two_servers:
        async with server.client() as client:
            await SlotWarmer(client, digest, digest_tokens=tokens, model="m", ctx=2048).warm_all(
                server.spec.parallel, verify=False
            )
    requests = questions(12, "scale")
    before = [server_tasks(server) for server in two_servers]

    with Ledger(tmp_path / "two.sqlite3") as ledger:
        engine = BatchEngine(
            [endpoint_of(first), endpoint_of(second)], digest, ledger, digest_tokens=tokens
        )
        planned = engine.plan(requests)
        outcome = await engine.run(requests, warm=False)
        both = list(outcome.iter_results(ledger))
    sent = [server_tasks(server) - count for server, count in zip(two_servers, before, strict=True)]

    # Greedy texts are not compared with a one-server run: llama.cpp's batched kernels make them
    # depend on the batch composition. What is guaranteed is the bookkeeping.
    assert [r.request_id for r in both] == [p.request_id for p in planned]
    assert [r.input_id for r in both] == [r.input_id for r in requests]
    assert outcome.failures == []
    assert outcome.stats.generated == 12
    assert sum(sent) == 12, sent  # each request reached exactly one server, once
    assert all(count > 0 for count in sent), sent
    assert {r.endpoint for r in both} == {first.base_url, second.base_url}
    assert outcome.stats.max_in_flight <= 4
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


async def test_a_run_left_open_takes_more_requests_warm_and_sends_each_once(
    shared_server: ResidentServer, tmp_path: Path
) -> None:
    digest = fresh_digest("open")
    tokens = await digest_tokens(shared_server, digest)
    first, second = questions(3, "open-a"), questions(2, "open-b")
    with Ledger(tmp_path / "ledger.sqlite3") as ledger:
        engine = BatchEngine([endpoint_of(shared_server)], digest, ledger, digest_tokens=tokens)
        await engine.run(first[:1])  # one row of the first set is done before the run
        before = server_tasks(shared_server)
        async with engine.session() as run:
            early = await run.add(first)
            # The workers wait for more; the last row of the first set is done in this run.
            late = await run.add([*second, first[2]])
        sent = server_tasks(shared_server) - before
        rows = [[r.input_id for r in outcome.iter_results(ledger)] for outcome in (early, late)]
        cached = [r.cached_tokens for r in late.iter_results(ledger)]

    assert rows == [[r.input_id for r in first], [*(r.input_id for r in second), "open-a2"]]
    assert [(o.stats.total, o.stats.from_ledger, o.stats.generated) for o in (early, late)] == [
        (3, 1, 2),
        (3, 1, 2),
    ]
    assert sent == 4  # each request once, across both sets
    assert len(early.warmups) == 1
    assert late.warmups == early.warmups  # one warm-up for the run: the later set found it warm
    assert min(cached) >= tokens


async def test_a_request_the_server_rejects_or_json_cannot_carry_fails_alone_unrecorded(
    shared_server: ResidentServer, tmp_path: Path
) -> None:
    digest = SystemDigest.from_text("You answer briefly.\n")
    tokens = await digest_tokens(shared_server, digest)
    too_long = GenerationRequest(
        input_id="long",
        messages=[ChatMessage(role="user", content="word " * 5000)],
        params=SamplingParams(max_tokens=4),
    )
    # A body JSON cannot carry fails alone too, unsent (httpx's ValueError ended the batch).
    unsendable = GenerationRequest(
        input_id="nan",
        messages=[ChatMessage(role="user", content="A number?")],
        params=SamplingParams(max_tokens=4, json_schema={"type": "number", "maximum": math.nan}),
    )
    good = questions(2, "fine")
    with Ledger(tmp_path / "ledger.sqlite3") as ledger:
        outcome = await BatchEngine(
            [endpoint_of(shared_server)], digest, ledger, digest_tokens=tokens
        ).run([too_long, unsendable, *good])
        assert ledger.count() == 2
        rows = list(outcome.iter_results(ledger))
    failures = {f.input_id: f.reason for f in outcome.failures}
    assert failures.keys() == {"long", "nan"}
    assert "rejected by the server" in failures["long"]
    assert "cannot be sent as JSON" in failures["nan"]
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


async def test_identical_lines_are_three_samples_unless_greedy_or_seeded(
    shared_server: ResidentServer, tmp_path: Path
) -> None:
    digest = fresh_digest("samples")
    tokens = await digest_tokens(shared_server, digest)
    message = [ChatMessage(role="user", content="Write one word about the sea.")]

    def lines(params: SamplingParams, scope: str) -> list[GenerationRequest]:
        return [
            GenerationRequest(
                input_id=f"line{i}", messages=message, params=params, sample_scope=scope
            )
            for i in range(3)
        ]

    sampled = SamplingParams(max_tokens=6, temperature=1.0, top_p=1.0)
    sent: dict[str, int] = {}
    with Ledger(tmp_path / "ledger.sqlite3") as ledger:
        engine = BatchEngine([endpoint_of(shared_server)], digest, ledger, digest_tokens=tokens)
        for name, params, scope in (
            ("sampled", sampled, "batch_a"),
            ("rerun", sampled, "batch_a"),
            ("another batch", sampled, "batch_b"),
            ("greedy", SamplingParams(max_tokens=6, temperature=0.0), "batch_c"),
            ("seeded", sampled.model_copy(update={"seed": 7}), "batch_d"),
        ):
            before = server_tasks(shared_server)
            outcome = await engine.run(lines(params, scope), warm=False)
            sent[name] = server_tasks(shared_server) - before
            rows = list(outcome.iter_results(ledger))
            assert [r.input_id for r in rows] == ["line0", "line1", "line2"], name
            assert len({r.request_id for r in rows}) == 3, name
        rows_in_ledger = ledger.count()

    assert sent == {"sampled": 3, "rerun": 0, "another batch": 3, "greedy": 1, "seeded": 1}
    assert rows_in_ledger == 3 + 3 + 1 + 1
