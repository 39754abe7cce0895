"""Typed async client for llama-server (llama.cpp and ik_llama.cpp).

Generation calls (`chat`, `text_completion`, `complete`) make exactly one attempt, bounded by a
total deadline: the batch engine is the one retry layer, because only it knows the request's
deadline, can restart a hung server and restore the digest before trying again. Retrying inside
the client as well multiplied the attempts (a hung server held one request for hours).

Control calls (`/props`, `/slots`, slot save/restore, `/tokenize`, `/metrics`) keep a short
bounded retry (`RetryPolicy` run by tenacity, 3 tries within seconds): they are cheap, idempotent,
answered in milliseconds by a healthy server, and callers such as the digest warm-up or the CLI
have no retry loop of their own; a transient connection reset should not fail a whole asset there.
"""

from __future__ import annotations

import asyncio
import contextlib
import json as jsonlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar

import httpx
import tenacity
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kimi_batch.llama.chat_stream import EVENT_STREAM, event_lines, read_chat_stream
from kimi_batch.llama.exceptions import (
    LlamaBodyError,
    LlamaBodyTooLargeError,
    LlamaConnectionError,
    LlamaError,
    LlamaFeatureError,
    LlamaHTTPError,
    LlamaLoadingError,
    LlamaResponseError,
    LlamaServerError,
    LlamaTimeoutError,
    http_error,
)
from kimi_batch.llama.messages import ChatExtras, ChatMessage, chat_body, completion_body
from kimi_batch.llama.responses import ChatCompletion, Completion, TextCompletion
from kimi_batch.llama.server_state import (
    HealthState,
    ServerMetrics,
    ServerProps,
    SlotFileResult,
    SlotState,
)
from kimi_batch.llama.urls import redact_url, url_credentials

ModelT = TypeVar("ModelT", bound=BaseModel)

CONNECT_TIMEOUT_S = 5.0
CONTROL_TIMEOUT_S = 30.0
# A 1024-token answer at 2 tok/s after a long prefill takes well over ten minutes on the target.
GENERATION_TIMEOUT_S = 3600.0
# The largest response body read from a server, streamed or not, counted as it arrives: a
# 32k-token answer with 20 logprobs a token is about 64 MiB of JSON, so a server sending without
# end (or a huge body) is cut at this size, not when the process runs out of memory.
MAX_BODY_BYTES = 256 * 1024 * 1024
_CHAT_COMPLETIONS = "/v1/chat/completions"
_TEXT_COMPLETIONS = "/v1/completions"


class RetryPolicy(BaseModel):
    """Bounded exponential backoff with jitter: the n-th retry waits between half and all of
    min(max_backoff_s, backoff_s * 2**(n-1))."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    attempts: int = Field(default=3, ge=1, le=20, description="Tries in all, the first included.")
    backoff_s: float = Field(default=0.5, ge=0.0, description="Delay before the second try.")
    max_backoff_s: float = Field(default=15.0, ge=0.0)


_RETRYABLE = (LlamaConnectionError, LlamaLoadingError, LlamaServerError, LlamaTimeoutError)


class LlamaClient:
    """One llama-server endpoint. Use as an async context manager, or call `aclose()`."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        retry: RetryPolicy | None = None,
        generation_timeout_s: float = GENERATION_TIMEOUT_S,
        transport: httpx.AsyncBaseTransport | None = None,
        max_body_bytes: int = MAX_BODY_BYTES,
    ) -> None:
        # Credentials in the URL (a proxy's basic auth) travel as an auth header only: base_url is
        # what logs, errors and the `endpoint` column show.
        self.base_url = redact_url(base_url)
        credentials = url_credentials(base_url)
        self.retry = retry or RetryPolicy()
        self._generation_timeout = httpx.Timeout(generation_timeout_s, connect=CONNECT_TIMEOUT_S)
        # Whether the server's chat template renders tools: asked once (`/props`), when the
        # first request with tools comes; None until then or when the server does not say.
        self._renders_tools: bool | None = None
        self._tools_asked = False
        # No compression (llama-server sends none): the byte cap counts what is held in memory.
        headers = {"Accept-Encoding": "identity"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            auth=httpx.BasicAuth(*credentials) if credentials else None,
            headers=headers,
            timeout=httpx.Timeout(CONTROL_TIMEOUT_S, connect=CONNECT_TIMEOUT_S),
            transport=transport,
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=32),
            event_hooks={"response": [_capped_to(max_body_bytes)]},
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # -- transport -------------------------------------------------------------------------

    async def _send_once(
        self,
        method: str,
        path: str,
        *,
        json: Mapping[str, Any] | None = None,
        params: Mapping[str, str] | None = None,
        timeout: httpx.Timeout | None = None,
    ) -> httpx.Response:
        url = f"{self.base_url}{path}"
        async with _bounded(method, url, timeout):
            response = await self._http.request(
                method,
                path,
                json=json,
                params=params,
                timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
            )
        if response.status_code >= 400:
            raise _http_error(response, url)
        return response

    async def _stream_answer(
        self, path: str, body: Mapping[str, Any], timeout: httpx.Timeout
    ) -> ChatCompletion:
        """One generation request; an event stream is rebuilt, a plain JSON answer (not
        streamed: with logprobs, or from a stand-in or a mock) parses as it is. Chat and text
        completions alike come back as a `ChatCompletion`."""
        url = f"{self.base_url}{path}"
        content = _json_content(body, url)
        async with (
            _bounded("POST", url, timeout),
            self._http.stream(
                "POST", path, content=content, headers=_JSON_TYPE, timeout=timeout
            ) as response,
        ):
            streamed = response.headers.get("content-type", "").startswith(EVENT_STREAM)
            if response.status_code < 400 and streamed:
                return await read_chat_stream(event_lines(response.aiter_bytes()), url)
            await response.aread()
            if response.status_code >= 400:
                raise _http_error(response, url)
            if path == _TEXT_COMPLETIONS:
                return self._parse(TextCompletion, response).as_chat()
            return self._parse(ChatCompletion, response)

    async def _request(
        self,
        method: str,
        path: str,
        *,
        json: Mapping[str, Any] | None = None,
        params: Mapping[str, str] | None = None,
        timeout: httpx.Timeout | None = None,
    ) -> httpx.Response:
        """A control call with the client's short bounded retry; a fresh tenacity loop per call
        (a loop keeps its state on its object), each wait half the backoff plus a random rest."""
        half, cap = self.retry.backoff_s / 2, self.retry.max_backoff_s / 2
        retrying = tenacity.AsyncRetrying(
            stop=tenacity.stop_after_attempt(self.retry.attempts),
            wait=tenacity.wait_exponential(multiplier=half, max=cap)
            + tenacity.wait_random_exponential(multiplier=half, max=cap),
            retry=tenacity.retry_if_exception_type(_RETRYABLE),
            reraise=True,
        )
        return await retrying(
            self._send_once, method, path, json=json, params=params, timeout=timeout
        )

    @staticmethod
    def _parse(model: type[ModelT], response: httpx.Response) -> ModelT:
        try:
            return model.model_validate_json(response.content)
        except ValidationError as error:
            first = "; ".join(
                f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors()[:3]
            )
            raise LlamaResponseError(
                f"unexpected {model.__name__} body from {response.request.url} "
                f"({error.error_count()} errors): {first}"
            ) from error

    # -- endpoints -------------------------------------------------------------------------

    async def health(self, *, timeout_s: float | None = None) -> HealthState:
        """One `/health` probe, no retry: OK, LOADING, or an exception."""
        timeout = _timeout(timeout_s) if timeout_s is not None else None
        try:
            response = await self._send_once("GET", "/health", timeout=timeout)
        except LlamaLoadingError:
            return HealthState.LOADING
        status = _json_object(response).get("status", "ok")
        try:
            return HealthState(status)
        except ValueError as error:
            raise LlamaResponseError(f"unknown /health status {status!r}") from error

    async def wait_until_healthy(self, timeout_s: float, *, poll_s: float = 0.5) -> None:
        """Poll `/health` until OK; a model load on the target can take many minutes. The wait
        ends at `timeout_s`, a probe in flight included (one probe alone may take 35 s)."""
        last: Exception | None = None
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    try:
                        if await self.health() is HealthState.OK:
                            return
                    except (LlamaConnectionError, LlamaTimeoutError, LlamaHTTPError) as error:
                        last = error
                    await asyncio.sleep(poll_s)
        except TimeoutError:
            pass
        raise LlamaTimeoutError(f"{self.base_url} not healthy after {timeout_s:.0f} s ({last})")

    async def props(self) -> ServerProps:
        return self._parse(ServerProps, await self._request("GET", "/props"))

    async def slots(self, *, timeout_s: float | None = None) -> list[SlotState]:
        """Slot states; with `timeout_s`, one short attempt (the engine's watchdog probe)."""
        if timeout_s is None:
            response = await self._request("GET", "/slots")
        else:
            response = await self._send_once("GET", "/slots", timeout=_timeout(timeout_s))
        payload = _json(response)
        if not isinstance(payload, list):
            raise LlamaResponseError(f"/slots returned {type(payload).__name__}, not a list")
        try:
            return [SlotState.model_validate(item) for item in payload]
        except ValidationError as error:
            raise LlamaResponseError(f"unexpected /slots entry: {error}") from error

    async def save_slot(self, slot_id: int, filename: str) -> SlotFileResult:
        """Save a slot's KV cache to `filename` inside the server's `--slot-save-path`."""
        return await self._slot_action(slot_id, "save", filename)

    async def restore_slot(self, slot_id: int, filename: str) -> SlotFileResult:
        return await self._slot_action(slot_id, "restore", filename)

    async def erase_slot(self, slot_id: int) -> SlotFileResult:
        return await self._slot_action(slot_id, "erase", None)

    async def _slot_action(self, slot_id: int, action: str, filename: str | None) -> SlotFileResult:
        body = {"filename": filename} if filename is not None else {}
        response = await self._request(
            "POST", f"/slots/{slot_id}", json=body, params={"action": action}
        )
        return self._parse(SlotFileResult, response)

    async def tokenize(self, content: str, *, add_special: bool = False) -> list[int]:
        response = await self._request(
            "POST", "/tokenize", json={"content": content, "add_special": add_special}
        )
        tokens = _json_object(response).get("tokens")
        if not isinstance(tokens, list):
            raise LlamaResponseError("/tokenize returned no token list")
        # with_pieces=false gives ints; a build that returns pieces gives objects with an id.
        try:
            return [_token_id(t["id"] if isinstance(t, dict) else t) for t in tokens]
        except (KeyError, TypeError, ValueError) as error:
            message = f"/tokenize returned a malformed token list: {error!r}"
            raise LlamaResponseError(message) from error

    async def apply_template(
        self, messages: Sequence[ChatMessage], *, tools: Sequence[Mapping[str, Any]] = ()
    ) -> str:
        """The prompt text the server's chat template renders for `messages` (and the function
        `tools` offered with them)."""
        body: dict[str, Any] = {"messages": [m.model_dump() for m in messages]}
        if tools:
            body["tools"] = list(tools)
        response = await self._request("POST", "/apply-template", json=body)
        prompt = _json_object(response).get("prompt")
        if not isinstance(prompt, str):
            raise LlamaResponseError("/apply-template returned no prompt")
        return prompt

    async def complete(
        self,
        prompt: str,
        *,
        n_predict: int,
        slot_id: int | None = None,
        cache_prompt: bool = True,
        extra: Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> Completion:
        """`POST /completion` on a raw prompt; one attempt, at most `timeout_s` seconds."""
        body: dict[str, Any] = {
            "prompt": prompt,
            "n_predict": n_predict,
            "cache_prompt": cache_prompt,
            **(extra or {}),
        }
        if slot_id is not None:
            body["id_slot"] = slot_id
        response = await self._send_once(
            "POST", "/completion", json=body, timeout=self._generation_timeout_for(timeout_s)
        )
        return self._parse(Completion, response)

    async def chat(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_tokens: int,
        temperature: float = 0.7,
        top_p: float = 0.95,
        seed: int | None = None,
        slot_id: int | None = None,
        top_logprobs: int = 0,
        json_schema: Mapping[str, Any] | None = None,
        extras: ChatExtras | None = None,
        timeout_s: float | None = None,
    ) -> ChatCompletion:
        """`POST /v1/chat/completions`, one attempt of at most `timeout_s` seconds (default
        `generation_timeout_s`); `slot_id` pins the request to a slot holding the digest.
        Raises `LlamaFeatureError`, sending nothing, for tools the chat template cannot render."""
        if extras is not None and extras.tools:
            await self._check_renders_tools()
        body = chat_body(
            messages,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            slot_id=slot_id,
            top_logprobs=top_logprobs,
            json_schema=json_schema,
            extras=extras,
        )
        return await self._stream_answer(
            _CHAT_COMPLETIONS, body, self._generation_timeout_for(timeout_s)
        )

    async def text_completion(
        self,
        prompt: str,
        *,
        max_tokens: int,
        temperature: float = 0.7,
        top_p: float = 0.95,
        seed: int | None = None,
        slot_id: int | None = None,
        logprobs: int = 0,
        extras: ChatExtras | None = None,
        timeout_s: float | None = None,
    ) -> ChatCompletion:
        """`POST /v1/completions` on a raw prompt (no chat template), one attempt of at most
        `timeout_s` seconds; the answer's text is the returned message's content."""
        body = completion_body(
            prompt,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            slot_id=slot_id,
            logprobs=logprobs,
            extras=extras,
        )
        return await self._stream_answer(
            _TEXT_COMPLETIONS, body, self._generation_timeout_for(timeout_s)
        )

    async def _check_renders_tools(self) -> None:
        if not self._tools_asked:
            self._renders_tools = (await self.props()).renders_tools
            self._tools_asked = True
        if self._renders_tools is False:
            raise LlamaFeatureError(
                f"{self.base_url}: the served model's chat template does not render tools, so "
                "llama-server would answer as if none were given (serve a model, or a "
                "--chat-template-file, whose template describes tools)"
            )

    def _generation_timeout_for(self, timeout_s: float | None) -> httpx.Timeout:
        return self._generation_timeout if timeout_s is None else _timeout(timeout_s)

    async def metrics(self, *, timeout_s: float | None = None) -> ServerMetrics:
        """Prometheus counters (needs `--metrics`); with `timeout_s`, one short attempt."""
        if timeout_s is None:
            response = await self._request("GET", "/metrics")
        else:
            response = await self._send_once("GET", "/metrics", timeout=_timeout(timeout_s))
        return ServerMetrics.parse(response.text)


def _timeout(seconds: float) -> httpx.Timeout:
    return httpx.Timeout(seconds, connect=min(CONNECT_TIMEOUT_S, seconds))


def _total_seconds(timeout: httpx.Timeout | None) -> float | None:
    """The longest phase of a timeout plus the connect phase: a bound on the whole exchange."""
    if timeout is None:
        return CONTROL_TIMEOUT_S + CONNECT_TIMEOUT_S
    phases = [t for t in (timeout.read, timeout.write, timeout.pool) if t is not None]
    return max(phases, default=CONTROL_TIMEOUT_S) + (timeout.connect or 0.0)


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError as error:
        raise LlamaResponseError(f"non-JSON body from {response.request.url}") from error


def _json_object(response: httpx.Response) -> dict[str, Any]:
    payload = _json(response)
    if not isinstance(payload, dict):
        raise LlamaResponseError(f"expected a JSON object from {response.request.url}")
    return payload


_JSON_TYPE = {"Content-Type": "application/json"}


def _json_content(body: Mapping[str, Any], url: str) -> bytes:
    """A generation request's body as httpx writes JSON (compact UTF-8, no NaN). One that JSON
    cannot carry is that request's error, not a ValueError that would end the whole batch."""
    try:
        text = jsonlib.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        return text.encode()
    except ValueError as error:  # NaN or an infinity; a lone surrogate's UnicodeEncodeError
        raise LlamaBodyError(f"the request to {url} cannot be sent as JSON: {error}") from error


@contextlib.asynccontextmanager
async def _bounded(method: str, url: str, timeout: httpx.Timeout | None) -> AsyncIterator[None]:
    """The whole exchange within its total deadline (httpx's read timeout is per read: a server
    trickling bytes could outlive it), transport failures as typed errors."""
    try:
        async with asyncio.timeout(_total_seconds(timeout)):
            yield
    except (httpx.TimeoutException, TimeoutError) as error:
        raise LlamaTimeoutError(f"{method} {url} timed out: {error!r}") from error
    except httpx.DecodingError as error:  # a body its content-encoding does not decode
        raise LlamaResponseError(f"{method} {url}: undecodable body: {error!r}") from error
    except httpx.RequestError as error:  # the transport's, and any other of the request
        raise LlamaConnectionError(f"{method} {url}: {error!r}") from error


class _CappedStream(httpx.AsyncByteStream):
    """A response's bytes as they come off the wire, refused past `limit` in all: every reader
    (`aread`, `aiter_bytes`) pulls through it, so nothing is held beyond the cap first."""

    def __init__(self, inner: httpx.AsyncByteStream, limit: int, url: str) -> None:
        self._inner = inner
        self._limit = limit
        self._url = url

    async def __aiter__(self) -> AsyncIterator[bytes]:
        read = 0
        async for chunk in self._inner:
            read += len(chunk)
            if read > self._limit:
                raise LlamaBodyTooLargeError(
                    f"the response from {self._url} is over {self._limit} bytes: cut there"
                )
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


def _capped_to(limit: int) -> Callable[[httpx.Response], Awaitable[None]]:
    """An httpx response hook: it runs before the body is read, for streamed calls too."""

    async def cap(response: httpx.Response) -> None:
        url = redact_url(str(response.request.url))
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding != "identity":
            # Asked for none: a compressed body's size is only known once decoded (a small
            # gzip can decode to gigabytes), so it is refused unread.
            await response.aclose()
            raise LlamaBodyTooLargeError(
                f"the response from {url} is {encoding}-encoded though none was asked for"
            )
        stream = response.stream
        if isinstance(stream, httpx.AsyncByteStream):
            response.stream = _CappedStream(stream, limit, url)

    return cap


def _token_id(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"a token id is an integer, not {value!r}"[:200])
    return value


def _http_error(response: httpx.Response, url: str) -> LlamaError:
    message = response.text[:500]
    try:
        payload = response.json()
        if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
            message = str(payload["error"].get("message", message))
    except ValueError:
        pass
    return http_error(response.status_code, message, url=url)
