"""A streamed answer (server-sent events) rebuilt into the `ChatCompletion` a non-streamed chat
request returns: a chat answer's, or a text completion's (`/v1/completions`).

Why stream at all: this llama-server keeps generating a non-streamed answer whose client has
disconnected until the answer ends (a cancelled batch held its slots for as long as the answers
in flight took), while a streamed one stops at the next token it cannot send. So the client
streams every chat answer that asks for no logprobs (the stream leaves out the entry of a token
whose text is empty) and the layers above still see one `ChatCompletion`.

Per chunk, llama.cpp sends `choices[0].delta` (content, reasoning_content, tool_calls) or, for a
text completion, `choices[0].text`; `finish_reason` at the end, per-token `logprobs.content`
when asked, and in its last chunks `usage` (`stream_options.include_usage`) and `timings`;
`data: [DONE]` closes the stream. A tool call arrives in pieces: its first delta carries its
`index`, `id` and function `name`, the next ones more of its `arguments` text under the same
`index`. An error after the stream started arrives as an `error: {...}` line (or a data chunk
holding `error`).
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kimi_batch.llama.exceptions import (
    LlamaConnectionError,
    LlamaError,
    LlamaResponseError,
    http_error,
)
from kimi_batch.llama.responses import (
    AnswerEnvelope,
    ChatChoice,
    ChatCompletion,
    ChatMessageOut,
    ChatTokenLogprob,
    ChatUsage,
    CompletionLogprobs,
    ServerToolCall,
    Timings,
)

EVENT_STREAM = "text/event-stream"
_DONE = "[DONE]"


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class _FunctionDelta(_Lenient):
    name: str | None = None
    arguments: str | None = None


class _ToolCallDelta(_Lenient):
    index: int = 0
    id: str | None = None
    type: str | None = None
    function: _FunctionDelta | None = None


class _Delta(_Lenient):
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[_ToolCallDelta] | None = None


class _ChunkChoice(_Lenient):
    index: int = 0
    delta: _Delta = Field(default_factory=_Delta)
    text: str | None = None  # a text completion's chunk
    finish_reason: str | None = None
    logprobs: CompletionLogprobs | None = None


class _ToolCallParts:
    """One tool call as its deltas arrive: the id and name once, the arguments in pieces."""

    def __init__(self) -> None:
        self.id = ""
        self.name = ""
        self.arguments: list[str] = []

    def add(self, delta: _ToolCallDelta) -> None:
        self.id = delta.id or self.id
        if delta.function is not None:
            self.name = delta.function.name or self.name
            if delta.function.arguments:
                self.arguments.append(delta.function.arguments)

    def call(self) -> ServerToolCall:
        function = {"name": self.name, "arguments": "".join(self.arguments)}
        return ServerToolCall.model_validate({"id": self.id, "function": function})


class _ChatChunk(AnswerEnvelope):
    """One `chat.completion.chunk` (or `text_completion`) event."""

    choices: list[_ChunkChoice] = Field(default_factory=list)


class _ChatAssembly:
    """The answer so far: text pieces appended, the last value of every whole field kept."""

    def __init__(self) -> None:
        self.head: _ChatChunk | None = None
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.tool_calls: dict[int, _ToolCallParts] = {}
        self.logprobs: list[ChatTokenLogprob] | None = None
        self.finish_reason: str | None = None
        self.usage: ChatUsage | None = None
        self.timings: Timings | None = None
        self.slot_fields: dict[str, int] = {}

    def add(self, chunk: _ChatChunk) -> None:
        self.head = self.head or chunk
        for choice in chunk.choices[:1]:  # one choice is asked for (n=1)
            for piece in (choice.delta.content, choice.text):
                if piece:
                    self.content.append(piece)
            if choice.delta.reasoning_content:
                self.reasoning.append(choice.delta.reasoning_content)
            for call in choice.delta.tool_calls or ():
                self.tool_calls.setdefault(call.index, _ToolCallParts()).add(call)
            if choice.logprobs is not None and choice.logprobs.content is not None:
                self.logprobs = self.logprobs or []
                self.logprobs.extend(choice.logprobs.content)
            self.finish_reason = choice.finish_reason or self.finish_reason
        self.usage = chunk.usage or self.usage
        self.timings = chunk.timings or self.timings
        for name in ("id_slot", "n_past", "tokens_cached"):
            value = getattr(chunk, name)
            if value is not None:
                self.slot_fields[name] = value

    def completion(self, url: str) -> ChatCompletion:
        if self.head is None or self.finish_reason is None:
            # The server went away mid-answer (a crash, a restart): retryable, as a non-streamed
            # request whose connection dropped.
            raise LlamaConnectionError(f"POST {url}: the stream ended before the answer did")
        calls = [self.tool_calls[index].call() for index in sorted(self.tool_calls)]
        message = ChatMessageOut(
            content="".join(self.content),
            reasoning_content="".join(self.reasoning) or None,
            tool_calls=calls or None,
        )
        logprobs = CompletionLogprobs(content=self.logprobs) if self.logprobs is not None else None
        choice = ChatChoice(finish_reason=self.finish_reason, message=message, logprobs=logprobs)
        return ChatCompletion(
            id=self.head.id,
            model=self.head.model,
            created=self.head.created,
            choices=[choice],
            usage=self.usage,
            timings=self.timings,
            **self.slot_fields,
        )


def _stream_error(payload: Any, url: str) -> LlamaError:
    """The typed error of an in-stream `error` (llama.cpp: `{"error": {code, message, type}}`)."""
    error = payload.get("error", payload) if isinstance(payload, dict) else payload
    if not isinstance(error, dict):
        return LlamaResponseError(f"error event from {url}: {str(payload)[:500]}")
    code = error.get("code")
    status = code if isinstance(code, int) and 400 <= code < 600 else 500
    return http_error(status, str(error.get("message", error))[:500], url=url)


def _load(data: str, url: str) -> Any:
    try:
        payload = json.loads(data)
    except (ValueError, RecursionError) as error:
        # RecursionError: nesting past the parser's depth, which no engine path catches (it
        # ended the whole run); the same body sent whole is a ValidationError, so refused alike.
        raise LlamaResponseError(f"non-JSON event from {url}: {data[:200]!r}") from error
    if _SURROGATE_ESCAPE.search(data) is None:
        return payload  # no escape of a surrogate: the text is the UTF-8 the line was read as
    try:
        # A `\udXXX` escape with no pair parses to a lone surrogate, which no answer can hold
        # (the ledger stores UTF-8): refused, as the parser of a whole answer refuses it.
        json.dumps(payload, ensure_ascii=False).encode()
    except UnicodeEncodeError as error:
        raise LlamaResponseError(f"event from {url} is not valid Unicode: {error}") from error
    return payload


# A JSON escape of a UTF-16 surrogate (`\ud800`-`\udfff`), paired or not: only these can parse
# to a lone one.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


# The SSE spec's line ends, and only those: CRLF, LF, CR.
_LINE_END = re.compile(rb"\r\n|\r|\n")


async def event_lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[str]:
    """The lines of an event stream's body, split where the SSE spec splits them (CRLF, LF, CR).

    Not httpx's `aiter_lines`: it splits as `str.splitlines` does, at U+2028, U+2029, U+0085
    (and U+000B, U+000C, U+001C-U+001E) too, and llama-server writes those three raw in its JSON
    (nlohmann's dump without ensure_ascii): an answer holding one had its event cut in two and
    failed as non-JSON, on every attempt. Split as bytes (no byte of a multi-byte UTF-8
    character is a CR or LF), each line decoded as UTF-8, as the spec decodes a stream, and one
    byte order mark opening the stream dropped, as the spec drops it (kept, it made the first
    line a field no one reads, and its event's text was lost silently). A last line without
    its line end is still read, as `aiter_lines` read it."""
    pending: list[bytes] = []
    for_crlf = False  # the last chunk ended in a CR, whose LF may open the next chunk
    first = True
    async for chunk in chunks:
        if not chunk:
            continue
        if for_crlf and chunk.startswith(b"\n"):
            chunk = chunk[1:]
        for_crlf = chunk.endswith(b"\r")
        *lines, rest = _LINE_END.split(chunk)
        for line in lines:
            pending.append(line)
            yield _decoded(pending, first)
            pending, first = [], False
        pending.append(rest)
    if any(pending):
        yield _decoded(pending, first)


def _decoded(parts: list[bytes], first: bool) -> str:
    line = b"".join(parts).decode("utf-8", errors="replace")
    return line.removeprefix("\ufeff") if first else line


async def read_chat_stream(lines: AsyncIterator[str], url: str) -> ChatCompletion:
    """Read an event stream to its end (`[DONE]`) and return the answer it carried."""
    assembly = _ChatAssembly()
    event = "message"
    async for line in lines:
        if not line:
            event = "message"  # a blank line ends an event
            continue
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "event":
            event = value
            continue
        if field not in ("data", "error"):
            continue  # a comment (":" keep-alive) or a field this client does not use
        if value == _DONE:
            break
        payload = _load(value, url)
        if (
            field == "error"
            or event == "error"
            or (isinstance(payload, dict) and "error" in payload)
        ):
            raise _stream_error(payload, url)
        try:
            assembly.add(_ChatChunk.model_validate(payload))
        except ValidationError as error:
            raise LlamaResponseError(f"unexpected chat chunk from {url}: {error}") from error
    return assembly.completion(url)
