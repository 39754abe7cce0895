"""Requests added to a run while it generates (`BatchEngine.session`, `BatchRun.add`), no server.

What is tested here depends on which request is in flight when the next set is added, and a real
llama-server cannot be made to hold an answer until the test says so: a scripted transport
answers each question when the test releases it, and records what reached it, in order.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from kimi_batch.engine.batch_engine import BatchEngine, Endpoint, EnginePolicy
from kimi_batch.engine.digest import SystemDigest
from kimi_batch.engine.generation import GenerationRequest, SamplingParams
from kimi_batch.engine.ledger import Ledger
from kimi_batch.llama.client import LlamaClient, RetryPolicy
from kimi_batch.llama.messages import ChatMessage
from kimi_batch_tests.support.results import chat_body

DIGEST = SystemDigest.from_text("You answer briefly.\n")
GREEDY = SamplingParams(max_tokens=4, temperature=0.0)

pytestmark = pytest.mark.timeout(30)


class HeldAnswers:
    """`/v1/chat/completions` answers a question once the test releases it (all of them with
    `release_all`); `seen` is every question that reached the server, in order."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self._released: dict[str, asyncio.Event] = {}
        self._free = False
        self._arrived: dict[str, asyncio.Event] = {}
        self.transport = httpx.MockTransport(self.handle)

    def _gate(self, question: str) -> asyncio.Event:
        return self._released.setdefault(question, asyncio.Event())

    def release(self, question: str) -> None:
        self._gate(question).set()

    def release_all(self) -> None:
        self._free = True
        for gate in self._released.values():
            gate.set()

    async def reached(self, question: str) -> None:
        await self._arrived.setdefault(question, asyncio.Event()).wait()

    async def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/v1/chat/completions":
            question = json.loads(request.content)["messages"][-1]["content"]
            self.seen.append(question)
            self._arrived.setdefault(question, asyncio.Event()).set()
            if question.startswith("bad"):
                return httpx.Response(400, json={"error": {"code": 400, "message": "too long"}})
            if not self._free:
                await self._gate(question).wait()
            return httpx.Response(200, json=chat_body(f"answer to {question}"))
        if path == "/health":
            return httpx.Response(200, json={"status": "ok"})
        if path == "/slots":
            return httpx.Response(200, json=[{"id": 0, "is_processing": False}])
        if path == "/metrics":
            return httpx.Response(200, text="llamacpp:n_decode_total 7\n")
        return httpx.Response(404, json={"error": {"message": f"no {path}"}})

    def client(self, endpoint: Endpoint) -> LlamaClient:
        return LlamaClient(
            endpoint.base_url, retry=RetryPolicy(attempts=1), transport=self.transport
        )


def ask(question: str, *, rank: int = 0, input_id: str | None = None) -> GenerationRequest:
    return GenerationRequest(
        input_id=input_id or question,
        messages=[ChatMessage(role="user", content=question)],
        params=GREEDY,
        priority=rank,
    )


def engine_of(server: HeldAnswers, ledger: Ledger, *, slots: int = 1) -> BatchEngine:
    endpoint = Endpoint(base_url="http://llama", slots=slots, model="m", n_predict=64)
    return BatchEngine(
        [endpoint],
        DIGEST,
        ledger,
        digest_tokens=10,
        policy=EnginePolicy(attempts=2, backoff_s=0.0, load_wait_s=2.0),
        client_factory=server.client,
    )


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "ledger.sqlite3")


async def test_a_request_asked_while_its_twin_is_in_flight_is_sent_once_for_both(
    ledger: Ledger,
) -> None:
    server = HeldAnswers()
    async with engine_of(server, ledger, slots=2).session(warm=False) as run:
        first = run.add([ask("q0")])
        await server.reached("q0")
        second = run.add([ask("q0", input_id="other"), ask("q1")])
        server.release_all()
        early, late = await first, await second

    assert sorted(server.seen) == ["q0", "q1"]  # q0 once, though two sets asked for it
    assert [r.input_id for r in late.iter_results(ledger)] == ["other", "q1"]
    assert (late.stats.generated, late.stats.from_ledger) == (2, 0)
    assert early.stats.generated == 1
    # The second set joined a run with a request in flight: the slots had not drained.
    assert (early.stats.in_flight_at_start, late.stats.in_flight_at_start) == (0, 1)


async def test_a_set_added_later_goes_out_by_its_rank(ledger: Ledger) -> None:
    server = HeldAnswers()
    async with engine_of(server, ledger).session(warm=False) as run:
        newer = run.add([ask(f"new{i}", rank=3) for i in range(3)])
        await server.reached("new0")
        older = run.add([ask("old0", rank=0)])
        server.release_all()
        await newer
        await older

    # The one slot was busy with new0; the older partition's request went next.
    assert server.seen == ["new0", "old0", "new1", "new2"]


async def test_a_queued_request_asked_again_at_a_lower_rank_moves_up(ledger: Ledger) -> None:
    server = HeldAnswers()
    async with engine_of(server, ledger).session(warm=False) as run:
        newer = run.add([ask(f"new{i}", rank=3) for i in range(3)])
        await server.reached("new0")
        older = run.add([ask("new2", rank=0, input_id="old")])
        server.release_all()
        await newer
        rows = [r.input_id for r in (await older).iter_results(ledger)]

    assert server.seen == ["new0", "new2", "new1"]
    assert rows == ["old"]


async def test_what_the_run_finished_or_failed_is_not_sent_again(ledger: Ledger) -> None:
    server = HeldAnswers()
    server.release_all()
    async with engine_of(server, ledger).session(warm=False) as run:
        await run.add([ask("q0"), ask("bad0")])
        again = await run.add([ask("q0", input_id="x"), ask("bad0", input_id="y")])

    assert sorted(server.seen) == ["bad0", "q0"]  # each once
    assert (again.stats.from_ledger, again.stats.failed, again.stats.generated) == (1, 1, 0)
    assert [f.input_id for f in again.failures] == ["y"]
    assert "rejected by the server" in again.failures[0].reason


async def test_past_the_stop_time_an_added_set_is_not_sent(ledger: Ledger) -> None:
    server = HeldAnswers()
    # Time enough for q0 to be sent first on a loaded machine (a stall past the stop time would
    # leave q0 unsent, and the test waiting for it).
    stop_at = datetime.now(UTC) + timedelta(seconds=2.0)
    async with engine_of(server, ledger).session(warm=False, stop_at=stop_at) as run:
        first = run.add([ask("q0")])
        await server.reached("q0")
        await asyncio.sleep((stop_at - datetime.now(UTC)).total_seconds() + 0.05)
        late = run.add([ask("q1"), ask("q0", input_id="twin")])
        server.release_all()
        done, stopped = await first, await late

    assert server.seen == ["q0"]
    assert not done.stopped_at_window  # in flight when the window closed: it finished
    assert stopped.stopped_at_window
    assert (stopped.stats.not_started, stopped.stats.generated) == (1, 1)
    assert [r.input_id for r in stopped.iter_results(ledger)] == ["twin"]


async def test_a_run_that_fails_tells_every_set_waiting_on_it(ledger: Ledger) -> None:
    server = HeldAnswers()

    def broken(endpoint: Endpoint) -> LlamaClient:
        raise RuntimeError("no client")

    engine = engine_of(server, ledger)
    engine.client_factory = broken
    with pytest.raises(RuntimeError, match="no client"):
        async with engine.session(warm=False) as run:
            await run.add([ask("q0")])
