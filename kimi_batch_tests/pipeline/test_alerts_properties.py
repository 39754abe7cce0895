"""Properties of the morning's alerts: the text a failed run or an unfinished night is told in,
and its delivery to a webhook (a real HTTP receiver on loopback).

- `failure_text` and `night_message`, for any partition keys, job names, step errors, check
  reasons and Trino problems (unicode, newlines, Slack markup, very long): the message fits
  `MAX_TEXT_CHARS` characters as built, so the webhook's cut never takes its counts, rows or
  link; every failed partition is named or counted among those left out.
- `post_message`, for any text (lone surrogates, markup, over the limit): the body the receiver
  gets is JSON of one `text` of at most `MAX_TEXT_CHARS` characters, the text itself when it fits
  and holds no lone surrogate; for any answer of the receiver (any status, a closed connection,
  no answer within the timeout, a redirect) and any URL, a `WebhookResult` comes back, never an
  exception, `delivered` exactly for a 2xx answer.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kimi_batch.engine import ProgressEvent
from kimi_batch.pipeline.alerts import (
    LISTED,
    FailedCheck,
    NightReport,
    PartitionRecord,
    PartitionState,
    failure_text,
    night_message,
)
from kimi_batch.pipeline.webhook import MAX_TEXT_CHARS, post_message

TEXT_EXAMPLES = settings(max_examples=150, deadline=None)
HTTP_EXAMPLES = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

# Slack's markup, newlines, scripts, joined emoji, a lone surrogate (a file name read with
# surrogateescape), every other code point besides.
_ODD = "<>&`*_~|<!channel>\n\r\t\x00日本語😀👩‍👩‍👧é\u0301\u2028\udcff\ud83d"
TEXT = st.text(st.one_of(st.characters(), st.sampled_from(_ODD)), max_size=40)
LONG = st.tuples(TEXT, st.integers(1, 5000)).map(lambda drawn: drawn[0] * drawn[1])
ERRORS = st.one_of(TEXT, LONG)
# Partition keys as the adapter writes them: a day and a source (`[A-Za-z0-9][A-Za-z0-9_.-]*`).
KEYS = st.builds(
    lambda source: f"2026-03-09|{source}",
    st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}", fullmatch=True),
)
RUN_IDS = st.uuids().map(str)
PROGRESS = st.one_of(
    st.none(),
    st.builds(
        lambda done, total: ProgressEvent(
            done=min(done, total),
            total=total,
            failed=0,
            completion_tokens_per_s=0.0,
            elapsed_s=0.0,
            eta_s=None,
        ),
        st.integers(0, 10**9),
        st.integers(0, 10**9),
    ),
)
DAGSTER_URL = "http://dagster.example:3000/"


def _look_line(text: str) -> str:
    return text.splitlines()[-1]


@TEXT_EXAMPLES
@given(
    run_id=RUN_IDS,
    job=st.from_regex(r"[a-z_]{1,60}", fullmatch=True),
    partition=st.one_of(KEYS, st.just("none")),
    covered=st.lists(KEYS, max_size=40),
    errors=st.lists(ERRORS, max_size=5),
    progress=PROGRESS,
)
def test_a_failed_runs_message_fits_and_keeps_its_partitions_rows_and_link(
    run_id: str,
    job: str,
    partition: str,
    covered: list[str],
    errors: list[str],
    progress: ProgressEvent | None,
) -> None:
    text = failure_text(run_id, job, partition, covered, errors, progress, DAGSTER_URL)

    assert len(text) <= MAX_TEXT_CHARS
    lines = text.splitlines()
    assert lines[0] == f"kimi_batch: run {run_id[:8]} of {job} FAILED"
    assert (
        _look_line(text) == f"look: http://dagster.example:3000/runs/{run_id} · kimi-batch status"
    )
    assert any(line.startswith("rows: ") for line in lines)
    if covered:
        where = next(line for line in lines if line.startswith("partitions: "))
        assert where.startswith(f"partitions: {len(covered)} (")
        assert all(key in where for key in covered[:LISTED])
        if len(covered) > LISTED:
            assert f" and {len(covered) - LISTED} more)" in where
    else:
        assert f"partition: {partition}" in lines


STALE = st.builds(
    PartitionRecord,
    key=KEYS,
    state=st.sampled_from([state for state in PartitionState if state != PartitionState.DONE]),
    run_id=st.one_of(st.none(), RUN_IDS),
)
CHECKS = st.builds(
    FailedCheck,
    partition=KEYS,
    asset=st.sampled_from(["distilled_responses", "amplified_prompts"]),
    check=st.sampled_from(["truncation_rate", "benchmark_contamination"]),
    reason=ERRORS,
)


@TEXT_EXAMPLES
@given(
    fresh=st.booleans(),
    freshness=ERRORS,
    stale=st.lists(STALE, max_size=30),
    checks=st.lists(CHECKS, max_size=30),
    trino=st.one_of(st.just(""), ERRORS.map(lambda text: text[:300])),
    progress=PROGRESS,
)
def test_a_nights_message_fits_and_names_or_counts_every_partition(
    fresh: bool,
    freshness: str,
    stale: list[PartitionRecord],
    checks: list[FailedCheck],
    trino: str,
    progress: ProgressEvent | None,
) -> None:
    report = NightReport(
        ds="2026-03-09",
        deadline=datetime(2026, 3, 10, 7, tzinfo=UTC),
        fresh=fresh,
        freshness=freshness,
        expected=[record.key for record in stale] + ["2026-03-09|done"],
        stale=stale,
        failed_checks=checks,
        trino=trino,
    )
    text = night_message(report, lambda _run_id: progress, DAGSTER_URL)

    assert len(text) <= MAX_TEXT_CHARS
    assert _look_line(text).startswith("look: http://dagster.example:3000/assets/")
    lines = text.splitlines()
    if stale:
        assert f"{len(stale)} of {len(stale) + 1} partition(s) not done:" in lines
        named = [line for line in lines if line.startswith("- 2026-03-09|")]
        for record in stale[:LISTED]:
            assert any(line.startswith(f"- {record.key}: ") for line in named)
        if len(stale) > LISTED:
            assert f"- ... and {len(stale) - LISTED} more" in lines
    if checks:
        assert f"{len(checks)} failed check(s):" in lines


def test_a_very_long_step_error_leaves_the_rows_and_the_runs_link_in_the_message() -> None:
    text = failure_text("r" * 36, "nightly_job", "none", [], ["x" * 10_000], None, DAGSTER_URL)

    assert len(text) <= MAX_TEXT_CHARS
    assert "rows: no rows reported" in text
    assert text.endswith(f"/runs/{'r' * 36} · kimi-batch status")


def test_a_very_long_check_reason_leaves_the_nights_link_in_the_message() -> None:
    check = FailedCheck(
        partition="2026-03-09|a", asset="distilled_responses", check="truncation_rate", reason="y"
    )
    report = NightReport(
        ds="2026-03-09",
        deadline=datetime(2026, 3, 10, 7, tzinfo=UTC),
        fresh=True,
        freshness="z" * 10_000,
        expected=["2026-03-09|a"],
        stale=[],
        failed_checks=[check.model_copy(update={"reason": "y" * 10_000})] * 3,
    )
    text = night_message(report, lambda _run_id: None, DAGSTER_URL)

    assert len(text) <= MAX_TEXT_CHARS
    assert "3 failed check(s):" in text
    assert text.splitlines()[-1].startswith("look: http://dagster.example:3000/assets/")


# ---- delivery -------------------------------------------------------------------------------


class _Hook:
    """A webhook on loopback that answers each POST as `mode` says and keeps the bodies."""

    def __init__(self, mode: str, status: int) -> None:
        self.bodies: list[bytes] = []
        self.release = threading.Event()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                hook.bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
                if mode == "close":
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if mode == "hang":
                    hook.release.wait(5)
                    return
                self.send_response(status)
                if mode == "redirect":
                    self.send_header("Location", "/elsewhere")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/services/T0/B0/s3cr3tpath"


@contextmanager
def _hook(mode: str, status: int = 200) -> Iterator[_Hook]:
    hook = _Hook(mode, status)
    thread = threading.Thread(
        target=hook.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        yield hook
    finally:
        hook.release.set()
        hook.server.shutdown()
        hook.server.server_close()


def _lone_surrogates(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


@HTTP_EXAMPLES
@given(text=st.one_of(ERRORS, LONG))
def test_the_body_posted_is_json_of_the_text_within_the_limit(text: str) -> None:
    with _hook("answer") as hook:
        result = post_message(hook.url, text)

    assert result.delivered
    (body,) = hook.bodies
    decoded = json.loads(body.decode("utf-8"))
    assert list(decoded) == ["text"]
    posted = decoded["text"]
    assert len(posted) <= MAX_TEXT_CHARS
    assert not _lone_surrogates(posted)
    if len(text) <= MAX_TEXT_CHARS and not _lone_surrogates(text):
        assert posted == text
    elif not _lone_surrogates(text):
        assert posted == text[: MAX_TEXT_CHARS - 1] + "…"


@HTTP_EXAMPLES
@given(
    mode=st.sampled_from(["answer", "redirect", "close", "hang"]),
    status=st.integers(200, 599),
    text=TEXT,
)
def test_any_answer_of_the_webhook_is_a_result_delivered_only_for_2xx(
    mode: str, status: int, text: str
) -> None:
    if mode == "redirect":
        status = 300 + status % 100 if status % 100 <= 8 else 302
    # Only a hanging webhook needs the short timeout: one that answers gets ample time, so a
    # loaded machine's slow answer is not read as a timeout (a CI run failed so at 0.2 s).
    timeout_s = 0.2 if mode == "hang" else 10.0
    with _hook(mode, status) as hook:
        result = post_message(hook.url, text, timeout_s=timeout_s)

    if mode in ("answer", "redirect"):
        assert result.status_code == status
        assert result.delivered == (200 <= status < 300)
        assert (result.error is None) == result.delivered
    else:
        assert not result.delivered
        assert result.status_code is None
        assert result.error
    assert "s3cr3tpath" not in (result.error or "")


@HTTP_EXAMPLES
@given(
    # No host a resolver is asked for: no scheme, a broken IPv6 host, loopback's discard port.
    url=st.one_of(
        TEXT,
        TEXT.map(lambda text: f"http://[{text}]/hook"),
        TEXT.map(lambda text: f"http://127.0.0.1:9/{text}"),
        st.just("http://[::1/"),
    )
)
def test_any_url_is_a_result_not_an_exception(url: str) -> None:
    result = post_message(url, "hello", timeout_s=0.2)

    assert not result.delivered or result.status_code is not None


def test_a_lone_surrogate_in_an_alert_is_posted_not_raised() -> None:
    with _hook("answer") as hook:
        result = post_message(hook.url, "cannot read /inbox/\udcff.jsonl")

    assert result.delivered
    assert json.loads(hook.bodies[0]) == {"text": "cannot read /inbox/\ufffd.jsonl"}


def test_an_unparsable_webhook_url_is_a_result_not_an_exception() -> None:
    result = post_message("http://[::1/hook", "hello")

    assert not result.delivered
    assert result.error


def test_a_webhook_url_with_an_invalid_idna_host_is_a_result_not_an_exception() -> None:
    # `xn--a` is no valid IDNA label: idna raised InvalidCodepoint (a UnicodeError, so a
    # ValueError, not httpx's InvalidURL) out of post_message and the sensor.
    result = post_message("https://xn--a.com/", "hello")

    assert not result.delivered
    assert result.status_code is None
    assert result.error
