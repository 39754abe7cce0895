"""Properties of a streamed answer read back by the llama client (`kimi_batch.llama.chat_stream`,
fed by `LlamaClient` from the response's bytes): whatever llama-server streams, the client
returns the answer the same request sent whole would have been, or a typed `LlamaError`.

- Round trip: any chat answer (content and reasoning text with any Unicode: newlines, CR, the
  line separators U+2028/U+2029/U+0085 llama-server writes raw inside its JSON, `data:` and
  `[DONE]` as text, emoji, empty pieces; 0..4 tool calls whose arguments arrive in arbitrary
  pieces, interleaved between calls; per-token logprobs; a finish reason; usage, timings and slot
  fields), streamed as llama-server streams it, reads as the non-streamed `ChatCompletion` of the
  same fields: text, reasoning, tool-call ids, names and arguments, logprobs, finish reason,
  usage, timings and the stats derived from them. The same for a text completion
  (`/v1/completions`, `choices[0].text`) against `TextCompletion.as_chat`.
- Framing: the SSE spec's variations do not change the answer: `data:` with or without its
  space, LF, CRLF or CR line ends, comment lines (`:` keep-alives), other fields (`id:`,
  `retry:`, `event: message`), an `event: error` with no data (never dispatched), extra blank
  lines, a byte order mark opening the stream, and the bytes arriving in chunks cut anywhere
  (inside a UTF-8 character, between a CR and its LF).
- Stats: whatever non-negative counts usage, timings and slot fields hold, an answer's
  `GenerationStats` builds, its cached and evaluated tokens within its prompt tokens.
- Errors: an `error:` line, an `event: error`, or a data chunk holding `error`, anywhere before
  `[DONE]` (after the finish reason too), raises the typed error of its code (`http_error`),
  never a partial answer. A stream cut at an event boundary before its finish reason is a
  `LlamaConnectionError` (retryable, as a dropped connection), one cut after it is the whole
  answer (the module's contract: the finish reason ends the answer, `[DONE]` only the stream);
  a stream cut anywhere is one of those or a `LlamaResponseError`, never another exception.
- Malformed data (text that is not JSON, JSON cut short, JSON of another shape, nesting past any
  parser's depth) is a `LlamaResponseError`, not a raw `JSONDecodeError`, `ValidationError` or
  `RecursionError`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kimi_batch.llama.chat_stream import EVENT_STREAM
from kimi_batch.llama.client import LlamaClient
from kimi_batch.llama.exceptions import (
    LlamaConnectionError,
    LlamaError,
    LlamaHTTPError,
    LlamaResponseError,
    http_error,
)
from kimi_batch.llama.messages import ChatMessage
from kimi_batch.llama.responses import ChatCompletion, TextCompletion

EXAMPLES = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FEW = settings(max_examples=70, deadline=None, suppress_health_check=[HealthCheck.too_slow])
HELLO = [ChatMessage(role="user", content="hi")]

# ---- answers ------------------------------------------------------------------------------------

# What a line reader could trip on: every character str.splitlines() breaks at (llama-server's
# JSON escapes those below U+0020 but writes U+0085, U+2028 and U+2029 raw), SSE syntax as text,
# scripts, combining marks, emoji, NUL, JSON syntax.
_ODD = (
    "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029",
    "\r\n",
    "data:",
    "data: [DONE]",
    "[DONE]",
    "error: ",
    ": ",
    "event: error",
    "日本語",
    "😀👩‍👩‍👧",
    "é\u0301",
    "\x00\x7f\ufeff\u200b",
    "\"'\\{}[]",
)
TEXT = st.lists(st.one_of(st.text(st.characters(codec="utf-8"), max_size=8), st.sampled_from(_ODD)),
                max_size=4).map("".join)  # fmt: skip
PIECES = st.lists(TEXT, max_size=6)
COUNTS = st.integers(0, 1 << 40)
MILLISECONDS = st.floats(min_value=0, max_value=1e9, allow_nan=False)
JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(1 << 60), 1 << 60), TEXT),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(TEXT, inner, max_size=3)),
    max_leaves=8,
)
# A model's arguments are usually JSON, but are whatever text it wrote.
ARGUMENTS = st.one_of(JSON_VALUES.map(lambda v: json.dumps(v, ensure_ascii=False)), TEXT)


@dataclass(frozen=True)
class ToolCallDraw:
    id: str
    name: str
    pieces: list[str]


@dataclass(frozen=True)
class Answer:
    """One answer's fields, to be streamed and sent whole."""

    content: list[str]
    reasoning: list[str] = field(default_factory=list[str])
    calls: list[ToolCallDraw] = field(default_factory=list[ToolCallDraw])
    # The order the calls' pieces are sent in: a call's index per piece, each call's in order.
    call_order: list[int] = field(default_factory=list[int])
    logprobs: bool = False
    finish: str = "stop"
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None
    slot: dict[str, int] = field(default_factory=dict[str, int])


def _pieces(text: str, cuts: list[int]) -> list[str]:
    points = sorted({min(c, len(text)) for c in cuts})
    bounds = [0, *points, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


@st.composite
def tool_calls(draw: st.DrawFn) -> ToolCallDraw:
    arguments = draw(ARGUMENTS)
    cuts = draw(st.lists(st.integers(0, max(len(arguments), 1)), max_size=5))
    call_id = draw(st.one_of(st.just(""), st.from_regex(r"call_[A-Za-z0-9]{1,12}", fullmatch=True)))
    name = draw(st.from_regex(r"[a-z_][a-z0-9_]{0,15}", fullmatch=True))
    return ToolCallDraw(id=call_id, name=name, pieces=_pieces(arguments, cuts))


USAGE = st.fixed_dictionaries(
    {"prompt_tokens": COUNTS, "completion_tokens": COUNTS, "total_tokens": COUNTS},
    optional={"prompt_tokens_details": st.fixed_dictionaries({"cached_tokens": COUNTS})},
)
TIMINGS = st.fixed_dictionaries(
    {"prompt_n": COUNTS, "prompt_ms": MILLISECONDS, "predicted_n": COUNTS,
     "predicted_ms": MILLISECONDS},
    optional={"cache_n": COUNTS, "n_past": COUNTS, "draft_n": COUNTS,
              "draft_n_accepted": COUNTS, "prompt_per_second": MILLISECONDS},
)  # fmt: skip
SLOT = st.fixed_dictionaries({}, optional={"id_slot": COUNTS, "n_past": COUNTS,
                                           "tokens_cached": COUNTS})  # fmt: skip


@st.composite
def answers(draw: st.DrawFn, *, chat: bool = True) -> Answer:
    calls = draw(st.lists(tool_calls(), max_size=4)) if chat else []
    # Any interleaving of the calls' pieces that keeps each call's own order.
    remaining = [len(c.pieces) for c in calls]
    order: list[int] = []
    while any(remaining):
        index = draw(st.sampled_from([i for i, n in enumerate(remaining) if n]))
        remaining[index] -= 1
        order.append(index)
    content = draw(PIECES)
    return Answer(
        content=content,
        reasoning=draw(PIECES) if chat else [],
        calls=calls,
        call_order=order,
        # The stream has no chunk to carry logprobs of an answer without tokens.
        logprobs=bool(content) and draw(st.booleans()),
        finish=draw(
            st.sampled_from(["stop", "length", "tool_calls"] if chat else ["stop", "length"])
        ),
        usage=draw(st.none() | USAGE),
        timings=draw(st.none() | TIMINGS),
        slot=draw(SLOT),
    )


_HEAD = {"id": "chatcmpl-7", "model": "smollm2", "created": 1700000000}


def _logprob(index: int, token: str) -> dict[str, Any]:
    top = [{"id": index, "token": token, "logprob": -index / 4}, {"token": "x", "logprob": -9.5}]
    return {"id": index, "token": token, "logprob": -index / 4, "top_logprobs": top}


def _chat_events(answer: Answer) -> list[dict[str, Any]]:
    """The chunks llama-server streams for `answer` (server_chat_msg_diff_to_json_oaicompat)."""

    def chunk(delta: dict[str, Any], **choice: Any) -> dict[str, Any]:
        body = {"index": 0, "delta": delta, "finish_reason": None, **choice}
        return {**_HEAD, "object": "chat.completion.chunk", "choices": [body]}

    events = [chunk({"role": "assistant", "content": None})]
    events += [chunk({"reasoning_content": piece}) for piece in answer.reasoning]
    for i, piece in enumerate(answer.content):
        logprobs = {"logprobs": {"content": [_logprob(i, piece)]}} if answer.logprobs else {}
        events.append(chunk({"content": piece}, **logprobs))
    sent = [0] * len(answer.calls)
    for index in answer.call_order:
        call, part = answer.calls[index], sent[index]
        sent[index] += 1
        delta: dict[str, Any] = {"index": index, "function": {"arguments": call.pieces[part]}}
        if part == 0:  # the first delta names the call
            delta["function"]["name"] = call.name
            if call.id:
                delta |= {"id": call.id, "type": "function"}
        events.append(chunk({"tool_calls": [delta]}))
    events.append(chunk({}, finish_reason=answer.finish))
    last = {**_HEAD, "object": "chat.completion.chunk", "choices": []}
    if answer.usage is not None:
        last["usage"] = answer.usage
    if answer.timings is not None:
        last["timings"] = answer.timings
    return [*events, last | answer.slot]


def _chat_whole(answer: Answer) -> ChatCompletion:
    message: dict[str, Any] = {"role": "assistant", "content": "".join(answer.content)}
    if "".join(answer.reasoning):
        message["reasoning_content"] = "".join(answer.reasoning)
    if answer.calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": "".join(c.pieces)}}
            for c in answer.calls
        ]  # fmt: skip
    choice: dict[str, Any] = {"index": 0, "finish_reason": answer.finish, "message": message}
    if answer.logprobs:
        choice["logprobs"] = {"content": [_logprob(i, p) for i, p in enumerate(answer.content)]}
    return ChatCompletion.model_validate(_whole_envelope(answer) | {"choices": [choice]})


def _whole_envelope(answer: Answer) -> dict[str, Any]:
    whole: dict[str, Any] = {**_HEAD, **answer.slot}
    if answer.usage is not None:
        whole["usage"] = answer.usage
    if answer.timings is not None:
        whole["timings"] = answer.timings
    return whole


def _text_events(answer: Answer) -> list[dict[str, Any]]:
    """A `/v1/completions` stream: `choices[0].text`, the finish reason, usage and timings last."""

    def chunk(text: str, **extra: Any) -> dict[str, Any]:
        choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": None}
        return {**_HEAD, "object": "text_completion", "choices": [choice], **extra}

    events = [chunk(piece) for piece in answer.content]
    last = chunk("", **_whole_envelope(answer))
    last["choices"][0]["finish_reason"] = answer.finish
    return [*events, last]


def _text_whole(answer: Answer) -> ChatCompletion:
    choice = {"index": 0, "text": "".join(answer.content), "finish_reason": answer.finish}
    whole = _whole_envelope(answer) | {"object": "text_completion", "choices": [choice]}
    return TextCompletion.model_validate(whole).as_chat()


def _view(answer: ChatCompletion) -> dict[str, Any]:
    """Everything the engine records of an answer (`record.completion_result`), and more."""
    return {
        "head": (answer.id, answer.model, answer.created),
        "text": answer.text,
        "reasoning": answer.reasoning_content,
        "finish": answer.finish_reason,
        "tool_calls": answer.tool_calls,
        "logprobs": answer.logprobs,
        "usage": answer.usage,
        "timings": answer.timings,
        "slot": (answer.id_slot, answer.n_past, answer.tokens_cached),
        "stats": answer.stats,
    }


# ---- the stream on the wire ------------------------------------------------------------------


@dataclass(frozen=True)
class Framing:
    """How the events are written: all variations the SSE spec reads alike."""

    eol: str = "\n"
    bom: bool = False  # a byte order mark opening the stream (the spec drops it)
    space: list[bool] = field(default_factory=list[bool])  # `data: ` or `data:`, per event
    extras: list[list[str]] = field(default_factory=list[list[str]])  # lines before an event
    blank: list[int] = field(default_factory=list[int])  # blank lines after an event (>= 1)
    cuts: list[int] = field(default_factory=list[int])  # where the body's chunks end


# An event without data is not dispatched (the spec), so an error event with none is no error.
_EXTRA_LINES = [":", ": keep-alive", ":data: [DONE]", "id: 7", "retry: 1000", "event: message",
                "data ", "ping: x", "event: error\n"]  # fmt: skip
FRAMINGS = st.builds(
    Framing,
    eol=st.sampled_from(["\n", "\r\n", "\r"]),
    bom=st.booleans(),
    space=st.lists(st.booleans(), max_size=40),
    extras=st.lists(st.lists(st.sampled_from(_EXTRA_LINES), max_size=2), max_size=40),
    blank=st.lists(st.integers(1, 3), max_size=40),
    cuts=st.lists(st.integers(0, 1 << 16), max_size=12),
)
PLAIN = Framing()


def _at(values: list[Any], index: int, default: Any) -> Any:
    return values[index] if index < len(values) else default


def _wire(events: Sequence[dict[str, Any] | str], framing: Framing = PLAIN) -> bytes:
    """The body llama-server writes (`format_oai_sse`: `data: <json>` and a blank line per event,
    its JSON with raw UTF-8, as nlohmann's dump without ensure_ascii); a str event is a raw line.
    """
    eol = framing.eol
    out: list[str] = []
    for i, event in enumerate(events):
        out += [line.replace("\n", eol) + eol for line in _at(framing.extras, i, [])]
        if isinstance(event, str):  # raw lines, "\n" between them
            out.append(event.replace("\n", eol) + eol)
        else:
            prefix = "data: " if _at(framing.space, i, True) else "data:"
            out.append(prefix + json.dumps(event, ensure_ascii=False) + eol)
        out.append(eol * _at(framing.blank, i, 1))
    return (("\ufeff" if framing.bom else "") + "".join(out)).encode()


def _chunked(body: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(body) + 1) for c in cuts})
    bounds = [0, *points, len(body)]
    return [body[a:b] for a, b in itertools.pairwise(bounds) if b > a]


class _Chunks(httpx.AsyncByteStream):
    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self._chunks:
            yield chunk


def _read(body: bytes, *, cuts: list[int] | None = None, text: bool = False) -> ChatCompletion:
    """What the client returns for a streamed answer whose bytes arrive in the chunks `cuts`
    makes."""
    chunks = _chunked(body, cuts or [])

    def handler(request: httpx.Request) -> httpx.Response:
        headers = {"content-type": EVENT_STREAM}
        return httpx.Response(200, headers=headers, stream=_Chunks(chunks))

    async def ask() -> ChatCompletion:
        async with LlamaClient("http://llama", transport=httpx.MockTransport(handler)) as client:
            if text:
                return await client.text_completion("The capital of France is", max_tokens=8)
            return await client.chat(HELLO, max_tokens=8)

    return asyncio.run(ask())


def _outcome(body: bytes, *, cuts: list[int] | None = None) -> ChatCompletion | LlamaError:
    try:
        return _read(body, cuts=cuts)
    except LlamaError as error:  # any other exception fails the test
        return error


_DONE = "data: [DONE]"

# ---- round trips --------------------------------------------------------------------------------


@EXAMPLES
@given(answer=answers(), framing=FRAMINGS)
def test_a_streamed_chat_answer_reads_as_the_same_answer_sent_whole(
    answer: Answer, framing: Framing
) -> None:
    body = _wire([*_chat_events(answer), _DONE], framing)
    assert _view(_read(body, cuts=framing.cuts)) == _view(_chat_whole(answer))


@EXAMPLES
@given(answer=answers(chat=False), framing=FRAMINGS)
def test_a_streamed_text_completion_reads_as_the_same_completion_sent_whole(
    answer: Answer, framing: Framing
) -> None:
    body = _wire([*_text_events(answer), _DONE], framing)
    assert _view(_read(body, cuts=framing.cuts, text=True)) == _view(_text_whole(answer))


@FEW
@given(answer=answers(), framing=FRAMINGS)
def test_the_framing_of_a_stream_does_not_change_its_answer(
    answer: Answer, framing: Framing
) -> None:
    events = [*_chat_events(answer), _DONE]
    assert _read(_wire(events, framing), cuts=framing.cuts) == _read(_wire(events))


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\x85", "a\u2028\u2029\x85b"])
def test_a_unicode_line_separator_in_an_answer_does_not_split_its_event(separator: str) -> None:
    """Found by the round trip: llama-server writes U+2028, U+2029 and U+0085 raw inside its
    JSON, and httpx's `aiter_lines` splits lines there as `str.splitlines` does (the SSE spec
    splits only at CR, LF and CRLF): the event's JSON was cut in two, and an answer holding one
    of them (quoted web text, a seeded request retried alike) failed every attempt as a
    `LlamaResponseError`."""
    answer = Answer(content=["one", separator, "two"], calls=[ToolCallDraw("c", "f", [separator])],
                    call_order=[0], reasoning=[separator])  # fmt: skip
    streamed = _read(_wire([*_chat_events(answer), _DONE]))
    assert streamed.text == f"one{separator}two"
    assert streamed.reasoning_content == separator
    assert [c.function.arguments for c in streamed.tool_calls or []] == [separator]


def test_a_cr_lf_split_between_chunks_is_one_line_end() -> None:
    answer = Answer(content=["a", "b"])
    body = _wire([*_chat_events(answer), _DONE], Framing(eol="\r\n"))
    every_cr = [i + 1 for i, byte in enumerate(body) if byte == ord("\r")]
    assert _read(body, cuts=every_cr).text == "ab"
    assert _read(body, cuts=list(range(len(body)))).text == "ab"  # one byte per chunk


def test_a_byte_order_mark_opening_the_stream_is_dropped() -> None:
    """Found by the framing property: the SSE spec drops one U+FEFF opening a stream; the first
    line was read as a field named "\\ufeffdata" and skipped, so an answer whose first event
    held text came back without it, silently."""
    events = [*_chat_events(Answer(content=["a", "b"]))[1:], _DONE]  # "a" in the first event
    assert _read(_wire(events, Framing(bom=True))).text == "ab"
    assert _read(_wire(events, Framing(bom=True)), cuts=[1, 2]).text == "ab"  # the mark cut up


# ---- errors -------------------------------------------------------------------------------------

CODES = st.one_of(
    st.integers(400, 599), st.sampled_from([None, 0, 200, 399, 600, -1, True, "503", 503.0])
)


@st.composite
def error_events(draw: st.DrawFn) -> tuple[list[dict[str, Any] | str], int | None, str]:
    """An in-stream error in one of its forms: its lines, its code and its message."""
    code = draw(CODES)
    message = draw(TEXT)
    error: dict[str, Any] = {"message": message, "type": "server_error"}
    if code is not None:
        error["code"] = code
    payload = {"error": error}
    text = json.dumps(payload, ensure_ascii=False)
    bare = json.dumps(error, ensure_ascii=False)  # the error object without its wrapper
    form = draw(st.sampled_from(["error_line", "data_error", "event_error", "bare_event"]))
    lines: list[dict[str, Any] | str] = {
        "error_line": [f"error: {text}"],  # llama.cpp's own field
        "data_error": [payload],
        "event_error": [f"event: error\ndata: {text}"],
        "bare_event": [f"event: error\ndata: {bare}"],
    }[form]
    status = code if isinstance(code, int) and 400 <= code < 600 else 500
    return lines, status, message


def _expected_error(status: int, message: str) -> type[LlamaHTTPError]:
    return type(http_error(status, message))


@FEW
@given(answer=answers(), error=error_events(), where=st.integers(0, 1 << 10))
def test_an_error_before_done_raises_its_typed_error(
    answer: Answer, error: tuple[list[dict[str, Any] | str], int, str], where: int
) -> None:
    lines, status, message = error
    events: list[dict[str, Any] | str] = list(_chat_events(answer))
    at = where % (len(events) + 1)  # after the finish reason and the usage too
    body = _wire([*events[:at], *lines, *events[at:], _DONE])
    outcome = _outcome(body)
    assert isinstance(outcome, LlamaHTTPError), outcome
    assert type(outcome) is _expected_error(status, message)
    assert (outcome.status, outcome.message) == (status, message)


@FEW
@given(answer=answers(), where=st.integers(0, 1 << 10))
def test_a_stream_cut_at_an_event_boundary_is_a_connection_error_until_its_finish_reason(
    answer: Answer, where: int
) -> None:
    events = _chat_events(answer)
    at = where % len(events)  # never the whole stream (nor its [DONE])
    outcome = _outcome(_wire(events[:at]))
    finished = at >= len(events) - 1  # the finish reason is the second last event
    if finished:
        assert isinstance(outcome, ChatCompletion), outcome
        whole = _view(_chat_whole(answer))
        # Everything but what the last chunk (usage, timings, slot fields) carries.
        view = _view(outcome)
        for name in ("head", "text", "reasoning", "finish", "tool_calls", "logprobs"):
            assert view[name] == whole[name]
    else:
        assert isinstance(outcome, LlamaConnectionError), outcome


@FEW
@given(answer=answers(), where=st.integers(0, 1 << 20), framing=FRAMINGS)
def test_a_stream_cut_anywhere_is_a_llama_error_or_the_whole_answer(
    answer: Answer, where: int, framing: Framing
) -> None:
    body = _wire([*_chat_events(answer), _DONE], framing)
    outcome = _outcome(body[: where % (len(body) + 1)], cuts=framing.cuts)
    if isinstance(outcome, ChatCompletion):
        whole = _view(_chat_whole(answer))
        view = _view(outcome)
        for name in ("head", "text", "reasoning", "finish", "tool_calls", "logprobs"):
            assert view[name] == whole[name]
    else:
        assert isinstance(outcome, LlamaConnectionError | LlamaResponseError), outcome


def _not_json(text: str) -> bool:
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return text != "[DONE]"
    return False


MALFORMED = st.one_of(
    TEXT.map(lambda t: t.replace("\r", "").replace("\n", "")).filter(_not_json),
    # JSON cut short, as a server that died mid-write would leave it.
    st.tuples(answers(), st.integers(0, 1 << 10)).map(
        lambda d: (t := json.dumps(_chat_events(d[0])[-2]))[: d[1] % len(t)]
    ),
    # JSON, but not a chunk.
    st.sampled_from(["null", "5", '"text"', "[]", "[{}]", "true", '{"choices": 5}',
                     '{"choices": [{"delta": {"content": 5}}]}', '{"created": "soon"}',
                     '{"choices": [{"delta": {"tool_calls": [{"index": "x"}]}}]}',
                     '{"usage": {"prompt_tokens": 1e400}}', '{"created": 1.5}',
                     '{"usage": {"prompt_tokens": ' + "9" * 5000 + "}}"]),
    # Nesting past any parser's depth.
    st.integers(20_000, 50_000).map(lambda n: "[" * n + "]" * n),
    st.integers(20_000, 50_000).map(lambda n: '{"a":' * n + "1" + "}" * n),
)  # fmt: skip


@FEW
@given(answer=answers(), bad=MALFORMED, where=st.integers(0, 1 << 10), error_line=st.booleans())
def test_malformed_data_is_a_response_error(
    answer: Answer, bad: str, where: int, error_line: bool
) -> None:
    events: list[dict[str, Any] | str] = list(_chat_events(answer))
    at = where % (len(events) + 1)
    line = f"{'error' if error_line else 'data'}: {bad}"
    outcome = _outcome(_wire([*events[:at], line, *events[at:], _DONE]))
    if error_line and not _not_json(bad) and bad.lstrip().startswith("{"):
        # A JSON object on an `error:` line is an error event whatever it holds.
        assert isinstance(outcome, LlamaHTTPError), outcome
    else:
        assert isinstance(outcome, LlamaResponseError), outcome


def test_deeply_nested_data_is_a_response_error() -> None:
    """Found by the malformed-data property: `json.loads` raises RecursionError (not a
    ValueError) past its depth, which escaped the client as a raw exception that no retry or
    failure path of the engine catches; the same body sent whole is a `LlamaResponseError`."""
    for nested in ("[" * 100_000 + "]" * 100_000, '{"a":' * 100_000 + "1" + "}" * 100_000):
        body = _wire([f"data: {nested}", _DONE])
        with pytest.raises(LlamaResponseError, match="non-JSON event"):
            _read(body)


# ---- stats ------------------------------------------------------------------------------------


@EXAMPLES
@given(usage=st.none() | USAGE, timings=st.none() | TIMINGS, slot=SLOT)
def test_the_stats_of_any_answer_hold_its_counts(
    usage: dict[str, Any] | None, timings: dict[str, Any] | None, slot: dict[str, int]
) -> None:
    whole = _chat_whole(Answer(content=["a"], usage=usage, timings=timings, slot=slot))
    stats = whole.stats
    assert stats.cached_tokens + stats.evaluated_tokens <= stats.prompt_tokens
    assert stats.evaluated_tokens == (timings or {}).get("prompt_n", 0)
    if timings is not None and "cache_n" in timings:
        assert stats.cached_tokens == timings["cache_n"]  # llama.cpp's own count first
    if usage is not None:
        assert stats.prompt_tokens >= usage["prompt_tokens"]
