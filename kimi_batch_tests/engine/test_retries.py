"""The engine is the one retry layer: failure paths through `httpx.MockTransport` (no server).

A real llama-server cannot be made to answer 503, refuse a connection, send a malformed body or
hang on demand; a scripted transport can, and counting what it saw proves the attempts are
bounded (one HTTP request per engine attempt).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from kimi_batch.engine.batch_engine import BatchEngine, BatchOutcome, Endpoint, EnginePolicy
from kimi_batch.engine.deadline import DeadlinePolicy
from kimi_batch.engine.digest import SystemDigest
from kimi_batch.engine.generation import GenerationRequest, SamplingParams
from kimi_batch.engine.ledger import Ledger
from kimi_batch.engine.watchdog import WatchdogPolicy
from kimi_batch.llama.client import LlamaClient, RetryPolicy
from kimi_batch.llama.messages import ChatMessage
from kimi_batch_tests.support.results import chat_body

BASE_URL = "http://llama"
DIGEST = SystemDigest.from_text("You answer briefly.\n")
DIGEST_TOKENS = 10
FAST = EnginePolicy(attempts=4, backoff_s=0.0, load_wait_s=2.0)

Reply = httpx.Response | Exception | Callable[[], Awaitable[httpx.Response]]


OK = httpx.Response(200, json=chat_body())
LOADING = httpx.Response(503, json={"error": {"code": 503, "message": "Loading model"}})


async def never_answers() -> httpx.Response:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


class FakeServer:
    """Scripted `/v1/chat/completions`; the control endpoints answer as a healthy server."""

    def __init__(self, replies: list[Reply]) -> None:
        self.replies = replies
        self.chat_calls = 0
        self.restores = 0
        self.transport = httpx.MockTransport(self.handle)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/v1/chat/completions":
            self.chat_calls += 1
            reply = self.replies[min(self.chat_calls, len(self.replies)) - 1]
            if isinstance(reply, Exception):
                raise reply
            if isinstance(reply, httpx.Response):
                return reply
            return await reply()
        if path == "/health":
            return httpx.Response(200, json={"status": "ok"})
        if path == "/slots":
            return httpx.Response(200, json=[{"id": 0, "is_processing": False}])
        if path.startswith("/slots/"):
            self.restores += 1
            return httpx.Response(200, json={"id_slot": 0, "n_restored": DIGEST_TOKENS})
        if path == "/metrics":
            # Counters that never move: a server that makes no progress.
            return httpx.Response(200, text="llamacpp:n_decode_total 7\n")
        return httpx.Response(404, json={"error": {"message": f"no {path}"}})

    def client(self, endpoint: Endpoint) -> LlamaClient:
        retry = RetryPolicy(attempts=1)
        return LlamaClient(endpoint.base_url, retry=retry, transport=self.transport)


def requests(n: int = 1) -> list[GenerationRequest]:
    return [
        GenerationRequest(
            input_id=f"in{i}",
            messages=[ChatMessage(role="user", content=f"question {i}")],
            params=SamplingParams(max_tokens=4, temperature=0.0),
        )
        for i in range(n)
    ]


async def run(
    fake: FakeServer,
    ledger: Ledger,
    *,
    policy: EnginePolicy = FAST,
    n: int = 1,
    stop_at: datetime | None = None,
    **hooks: Any,
) -> BatchOutcome:
    endpoint = Endpoint(base_url=BASE_URL, slots=1, model="m", n_predict=64)
    engine = BatchEngine(
        [endpoint],
        DIGEST,
        ledger,
        digest_tokens=DIGEST_TOKENS,
        policy=policy,
        client_factory=fake.client,
        **hooks,
    )
    return await engine.run(requests(n), warm=False, stop_at=stop_at)


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "ledger.sqlite3")


async def test_503_while_loading_then_success(ledger: Ledger) -> None:
    fake = FakeServer([LOADING, LOADING, OK])
    outcome = await run(fake, ledger)
    assert fake.chat_calls == 3
    assert outcome.failures == []
    assert [r.text for r in outcome.iter_results(ledger)] == ["hi"]


async def test_connection_refused_then_success_calls_the_respawn_hook(ledger: Ledger) -> None:
    fake = FakeServer([httpx.ConnectError("connection refused"), OK])
    unreachable: list[str] = []
    outcome = await run(fake, ledger, on_unreachable=unreachable.append)
    assert fake.chat_calls == 2
    assert unreachable == [BASE_URL]
    assert fake.restores == 1  # the slot got the digest back before the second send
    assert outcome.stats.generated == 1
    assert ledger.count() == 1


async def test_a_400_is_not_retried_and_not_recorded(ledger: Ledger) -> None:
    bad = httpx.Response(400, json={"error": {"message": "the request exceeds the context"}})
    fake = FakeServer([bad, OK])
    outcome = await run(fake, ledger)
    assert fake.chat_calls == 1
    assert [(f.input_id, f.attempts) for f in outcome.failures] == [("in0", 1)]
    assert "rejected by the server: the request exceeds the context" in outcome.failures[0].reason
    assert ledger.count() == 0


async def test_a_malformed_body_fails_after_the_engine_attempts(ledger: Ledger) -> None:
    fake = FakeServer([httpx.Response(200, content=b'{"choices": []}')])
    outcome = await run(fake, ledger, policy=FAST.model_copy(update={"attempts": 3}))
    assert fake.chat_calls == 3
    assert outcome.failures[0].attempts == 3
    assert "LlamaResponseError" in outcome.failures[0].reason
    assert ledger.count() == 0


async def test_attempts_are_bounded_one_http_request_each(ledger: Ledger) -> None:
    fake = FakeServer([httpx.Response(500, json={"error": {"message": "boom"}})])
    outcome = await run(fake, ledger)
    # Four engine attempts, four requests on the wire: the client adds none of its own.
    assert fake.chat_calls == FAST.attempts
    assert outcome.stats.failed == 1
    assert outcome.failures[0].attempts == FAST.attempts


async def test_a_request_past_its_deadline_is_cut_and_retried(ledger: Ledger) -> None:
    # The deadline also bounds the answer that must get through: a second on a loaded machine.
    quick = DeadlinePolicy(floor_s=1.0, multiplier=1.0, prompt_tok_s=1e6, decode_tok_s=1e6)
    policy = FAST.model_copy(update={"attempts": 2, "deadline": quick})
    fake = FakeServer([never_answers, OK])
    outcome = await run(fake, ledger, policy=policy)
    assert fake.chat_calls == 2
    assert outcome.failures == []
    assert outcome.stats.generated == 1


async def test_a_request_always_past_its_deadline_fails_with_the_reason(ledger: Ledger) -> None:
    quick = DeadlinePolicy(floor_s=0.2, multiplier=1.0, prompt_tok_s=1e6, decode_tok_s=1e6)
    policy = FAST.model_copy(update={"attempts": 2, "deadline": quick})
    fake = FakeServer([never_answers])
    outcome = await run(fake, ledger, policy=policy)
    assert fake.chat_calls == 2
    assert "LlamaTimeoutError" in outcome.failures[0].reason
    assert ledger.count() == 0


async def test_a_server_that_stops_progressing_is_restarted_and_the_request_sent_again(
    ledger: Ledger,
) -> None:
    # The stall period also bounds the send that must get through (on a loaded machine).
    watchdog = WatchdogPolicy(stall_s=1.5, probe_timeout_s=0.2, interval_s=0.05)
    # A generous deadline: only the watchdog can end the first send.
    policy = FAST.model_copy(update={"watchdog": watchdog})
    fake = FakeServer([never_answers, OK])
    hung: list[str] = []
    outcome = await run(fake, ledger, policy=policy, on_hung=hung.append)
    assert hung == [BASE_URL]
    assert outcome.stats.hangs == 1
    assert fake.chat_calls == 2
    assert fake.restores == 1  # digest restored from the save, not prefilled
    assert outcome.stats.generated == 1
    assert outcome.stats.digest_reprefills == 0


async def test_past_the_stop_time_nothing_is_sent(ledger: Ledger) -> None:
    fake = FakeServer([OK])
    stop_at = datetime.now(UTC) - timedelta(seconds=1)
    outcome = await run(fake, ledger, n=3, stop_at=stop_at)
    assert fake.chat_calls == 0
    assert outcome.stopped_at_window
    assert outcome.stats.not_started == 3
    assert outcome.stats.generated == 0
    assert outcome.failures == []


async def test_truncated_empty_and_reasoning_answers_are_recorded_as_such(ledger: Ledger) -> None:
    truncated = httpx.Response(
        200, json=chat_body("partial", finish_reason="length", reasoning="Let me think.")
    )
    empty = httpx.Response(200, json=chat_body(""))
    fake = FakeServer([truncated, empty])
    outcome = await run(fake, ledger, n=2)
    assert outcome.stats.truncated == 1
    assert outcome.stats.empty == 1
    first, second = outcome.iter_results(ledger)
    assert (first.finish_reason, first.text, first.reasoning_content) == (
        "length",
        "partial",
        "Let me think.",
    )
    assert first.truncated
    assert (second.text, second.reasoning_content, second.empty) == ("", None, True)


class UnreadableProbes(FakeServer):
    """A server whose progress probes cannot be read: /metrics missing and /slots an HTML page
    (an auth proxy), or /metrics with a NaN counter."""

    def __init__(self, replies: list[Reply], *, metrics: httpx.Response) -> None:
        super().__init__(replies)
        self.metrics = metrics
        self.probes = 0

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            self.probes += 1
            return self.metrics
        if request.url.path == "/slots" and request.method == "GET":
            self.probes += 1
            return httpx.Response(200, text="<html><body>Sign in</body></html>")
        return await super().handle(request)


async def slow_ok() -> httpx.Response:
    await asyncio.sleep(0.5)
    return OK


UNREADABLE = [
    pytest.param(httpx.Response(501, json={"error": {"message": "no metrics"}}), id="html-slots"),
    pytest.param(httpx.Response(200, text="llamacpp:n_decode_total NaN\n"), id="nan-counter"),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("metrics", UNREADABLE)
async def test_an_unreadable_probe_never_fails_a_finished_batch(
    ledger: Ledger, metrics: httpx.Response
) -> None:
    watchdog = WatchdogPolicy(stall_s=30.0, probe_timeout_s=0.2, interval_s=0.05)
    fake = UnreadableProbes([slow_ok], metrics=metrics)
    outcome = await run(fake, ledger, policy=FAST.model_copy(update={"watchdog": watchdog}))
    assert fake.probes >= 2  # the watchdog kept probing after the first unreadable answer
    assert outcome.failures == []
    assert outcome.stats.generated == 1
    assert outcome.stats.hangs == 0
    assert ledger.count() == 1


@pytest.mark.timeout(60)
@pytest.mark.parametrize("metrics", UNREADABLE)
async def test_an_unreadable_probe_counts_as_no_progress(
    ledger: Ledger, metrics: httpx.Response
) -> None:
    watchdog = WatchdogPolicy(stall_s=0.5, probe_timeout_s=0.2, interval_s=0.05)
    fake = UnreadableProbes([never_answers, OK], metrics=metrics)
    hung: list[str] = []
    outcome = await run(
        fake, ledger, policy=FAST.model_copy(update={"watchdog": watchdog}), on_hung=hung.append
    )
    assert hung == [BASE_URL]
    assert outcome.stats.hangs == 1
    assert outcome.stats.generated == 1


async def test_an_answer_the_ledger_cannot_keep_fails_its_request_and_the_batch_goes_on(
    ledger: Ledger,
) -> None:
    # A number past the largest double parses as infinity, which the ledger's JSON cannot hold.
    body = json.dumps(chat_body()).replace('"prompt_ms": 10.0', '"prompt_ms": 1e999')
    assert "1e999" in body
    unstorable = httpx.Response(200, content=body, headers={"content-type": "application/json"})
    fake = FakeServer([unstorable, OK])
    outcome = await run(fake, ledger, n=2)
    assert fake.chat_calls == 2  # not retried: the same answer would come back
    assert outcome.stats.generated == 1
    (failure,) = outcome.failures
    assert "cannot be stored" in failure.reason
    assert failure.attempts == 1
    assert [r.text for r in outcome.iter_results(ledger)] == ["hi"]
