"""OpenAI Batch API lines: a validated input line, a line's error, and the output and error lines.

Input (`/v1/batches`): one JSON object a line, `{custom_id, method, url, body}`, validated by
`batch_input` into `BatchRequestLine`s or `BatchLineError`s. A batch is answered exactly
as submitted: a chat line's leading system (or developer) message is the batch's own digest
(prefilled once, saved and restored into every slot, like the pipeline's), the other messages
are sent as they are, and the body's fields become the request's params. A completion line
(`/v1/completions`) is a raw prompt, sent as it is: no digest, no chat template.

Output: one writer (`response_line`, `error_line`) for the API's output and error files and for
`kimi-batch export`: a `chat.completion` body (tool calls included) for a chat line, a
`text_completion` body for a completion line, a `response` object for a Responses line
(`/v1/responses`, run as the chat request llama-server's own /v1/responses would make of it), as
OpenAI's batch output has them.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.engine import GenerationRequest, GenerationResult, RequestKind, SamplingParams
from kimi_batch.llama import ChatMessage, TokenLogprob, ToolCall
from kimi_batch.pipeline import RequestTag

CHAT_COMPLETIONS_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"
RESPONSES_URL = "/v1/responses"
LineKind = Literal["chat", "completion", "responses"]
"""What a batch's lines are: the shape they are read in and answered in."""
BATCH_ENDPOINTS: dict[str, LineKind] = {
    CHAT_COMPLETIONS_URL: "chat",
    COMPLETIONS_URL: "completion",
    RESPONSES_URL: "responses",
}
"""The endpoints a batch may name, and the kind of line each holds."""
# A Responses line runs as a chat request (instructions as the system turn, input items as the
# turns), which is what llama-server's own /v1/responses does with it.
_REQUEST_KIND: dict[LineKind, RequestKind] = {
    "chat": "chat",
    "completion": "completion",
    "responses": "chat",
}
API_STAGE = "api"
MAX_LISTED_ERRORS = 100


class BatchLineError(BaseModel):
    """One validation error of a batch input, in OpenAI's `errors.data[]` shape."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    code: str
    message: str
    param: str | None = None
    line: int | None = Field(default=None, description="1-based line of the input file.")


class BatchRequestLine(BaseModel):
    """A validated input line: the batch's system text (its digest), the rest, the params."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    custom_id: str = Field(min_length=1)
    line: int = Field(ge=1)
    system: str = Field(description="Leading system/developer text; '' when there is none.")
    messages: list[ChatMessage] = Field(
        min_length=1, description="After the system, as sent (a completion: its raw prompt)."
    )
    params: SamplingParams
    top_logprobs: int | None = Field(description="None: logprobs not asked for.")
    kind: LineKind = Field(default="chat", description="The batch endpoint's kind of line.")

    @property
    def prompt(self) -> str:
        """The last user message, or the raw prompt (the `prompt` column of the distilled row)."""
        return self.messages[-1].content

    def request(self) -> GenerationRequest:
        return GenerationRequest(
            input_id=self.custom_id,
            messages=self.messages,
            params=self.params,
            tag=RequestTag(stage=API_STAGE).wire,
            kind=_REQUEST_KIND[self.kind],
        )


class BatchInput(BaseModel):
    """A batch input file read whole: its valid lines, or why it does not validate."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lines: list[BatchRequestLine]
    errors: list[BatchLineError]
    error_count: int = Field(ge=0, description="All errors; `errors` lists the first ones.")


# ---- output ---------------------------------------------------------------------------------


class AnsweredRequest(BaseModel):
    """A finished request, whatever it was read from (a ledger result or a `distilled` row)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    custom_id: str
    request_id: str
    model: str
    created_at: datetime
    content: str
    reasoning: str | None = None
    logprobs: list[TokenLogprob] | None = None
    tool_calls: list[ToolCall] | None = None
    finish_reason: str
    prompt_tokens: int = Field(ge=0)
    completion_tokens: int = Field(ge=0)
    cached_tokens: int = Field(ge=0)

    @classmethod
    def from_result(cls, result: GenerationResult, *, custom_id: str) -> AnsweredRequest:
        return cls(
            custom_id=custom_id,
            request_id=result.request_id,
            model=result.model,
            created_at=result.created_at,
            content=result.text,
            reasoning=result.reasoning_content or None,
            logprobs=result.logprobs,
            tool_calls=result.tool_calls,
            finish_reason=result.finish_reason,
            prompt_tokens=result.prompt_tokens,
            completion_tokens=result.completion_tokens,
            cached_tokens=result.cached_tokens,
        )


def _epoch(moment: datetime) -> int:
    # Stored times are UTC; Parquet hands them back naive, and a naive `.timestamp()` would be
    # read as local time.
    aware = moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
    return int(aware.timestamp())


def _token(text: str, logprob: float) -> dict[str, Any]:
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def _logprobs(tokens: list[TokenLogprob], top_logprobs: int | None) -> dict[str, Any]:
    keep = len(tokens[0].top) if tokens and top_logprobs is None else (top_logprobs or 0)
    return {
        "content": [
            {
                **_token(t.token, t.logprob),
                "top_logprobs": [_token(a.token, a.logprob) for a in t.top[:keep]],
            }
            for t in tokens
        ],
        "refusal": None,
    }


def _text_logprobs(tokens: list[TokenLogprob], top_logprobs: int | None) -> dict[str, Any]:
    """Logprobs in the legacy completions shape: parallel lists, alternatives as a mapping."""
    keep = len(tokens[0].top) if tokens and top_logprobs is None else (top_logprobs or 0)
    offsets, offset = [], 0
    for t in tokens:
        offsets.append(offset)
        offset += len(t.token)
    return {
        "tokens": [t.token for t in tokens],
        "token_logprobs": [t.logprob for t in tokens],
        "top_logprobs": [{a.token: a.logprob for a in t.top[:keep]} for t in tokens],
        "text_offset": offsets,
    }


def _usage(answer: AnsweredRequest) -> dict[str, Any]:
    return {
        "prompt_tokens": answer.prompt_tokens,
        "completion_tokens": answer.completion_tokens,
        "total_tokens": answer.prompt_tokens + answer.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": answer.cached_tokens},
    }


def _chat_choice(answer: AnsweredRequest, top_logprobs: int | None) -> dict[str, Any]:
    # OpenAI's message of a tool-calling answer has `content: null` when it wrote no text.
    content = answer.content if answer.content or not answer.tool_calls else None
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
    if answer.tool_calls:
        message["tool_calls"] = [call.model_dump(mode="json") for call in answer.tool_calls]
    if answer.reasoning:
        message["reasoning_content"] = answer.reasoning
    return {
        "index": 0,
        "message": message,
        "logprobs": _logprobs(answer.logprobs, top_logprobs) if answer.logprobs else None,
        "finish_reason": answer.finish_reason,
    }


def _tool_echo(params: SamplingParams | None) -> dict[str, Any]:
    """The request's tool fields as a `response` object echoes them (OpenAI's defaults when
    unset); the tools back in the Responses shape, the function's fields beside `type`."""
    tools = (params.tools if params else None) or []
    return {
        "parallel_tool_calls": params is None or params.parallel_tool_calls is not False,
        "tool_choice": (params.tool_choice if params else None) or "auto",
        "tools": [{"type": "function", **tool["function"]} for tool in tools],
    }


def _response_object(answer: AnsweredRequest, params: SamplingParams | None) -> dict[str, Any]:
    """A Responses API `response` body: its text as one message item, then its tool calls."""
    output: list[dict[str, Any]] = []
    if answer.content or not answer.tool_calls:
        text = {"type": "output_text", "text": answer.content, "annotations": []}
        output.append(
            {
                "type": "message",
                "id": f"msg_{answer.request_id}",
                "status": "completed",
                "role": "assistant",
                "content": [text],
            }
        )
    for call in answer.tool_calls or []:
        output.append(
            {
                "type": "function_call",
                "id": f"fc_{call.id}",
                "call_id": call.id,
                "name": call.function.name,
                "arguments": call.function.arguments,
                "status": "completed",
            }
        )
    cut_off = answer.finish_reason == "length"
    return {
        "id": f"resp_{answer.request_id}",
        "object": "response",
        "created_at": _epoch(answer.created_at),
        "status": "incomplete" if cut_off else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut_off else None,
        "error": None,
        "model": answer.model,
        "output": output,
        **_tool_echo(params),
        "usage": {
            "input_tokens": answer.prompt_tokens,
            # What the server did not find in its cache it evaluated and kept in the slot.
            "input_tokens_details": {
                "cached_tokens": answer.cached_tokens,
                "cache_write_tokens": max(0, answer.prompt_tokens - answer.cached_tokens),
            },
            "output_tokens": answer.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": answer.prompt_tokens + answer.completion_tokens,
        },
    }


def _completion_object(answer: AnsweredRequest, top_logprobs: int | None) -> dict[str, Any]:
    logprobs = answer.logprobs
    choice: dict[str, Any] = {
        "text": answer.content,
        "index": 0,
        "logprobs": _text_logprobs(logprobs, top_logprobs) if logprobs else None,
        "finish_reason": answer.finish_reason,
    }
    return {
        "id": f"cmpl-{answer.request_id}",
        "object": "text_completion",
        "created": _epoch(answer.created_at),
        "model": answer.model,
        "choices": [choice],
        "usage": _usage(answer),
    }


def _chat_completion_object(answer: AnsweredRequest, top_logprobs: int | None) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{answer.request_id}",
        "object": "chat.completion",
        "created": _epoch(answer.created_at),
        "model": answer.model,
        "choices": [_chat_choice(answer, top_logprobs)],
        "usage": _usage(answer),
    }


def response_line(
    answer: AnsweredRequest,
    *,
    top_logprobs: int | None = None,
    kind: LineKind = "chat",
    params: SamplingParams | None = None,
) -> str:
    """The output-file line of a finished request, as OpenAI returns it for the batch's kind
    of line: a `chat.completion`, a `text_completion`, or a `response` object.

    `top_logprobs`: how many alternatives the request asked for (None: all that were kept).
    `params`: the request's sampling params, whose tool fields a `response` object echoes.
    An answer cut off at max_tokens is a success with `finish_reason: "length"` (a Responses
    answer: `status: "incomplete"`, reason `max_output_tokens`).
    """
    if kind == "completion":
        body = _completion_object(answer, top_logprobs)
    elif kind == "responses":
        body = _response_object(answer, params)
    else:
        body = _chat_completion_object(answer, top_logprobs)
    return json.dumps(
        {
            "id": f"batch_req_{answer.request_id}",
            "custom_id": answer.custom_id,
            "response": {"status_code": 200, "request_id": answer.request_id, "body": body},
            "error": None,
        },
        ensure_ascii=False,
    )


def error_line(*, custom_id: str, request_id: str | None, code: str, message: str) -> str:
    """The error-file line of a request that failed or was set aside (the reason as message)."""
    return json.dumps(
        {
            "id": f"batch_req_{request_id or custom_id}",
            "custom_id": custom_id,
            "response": None,
            "error": {"code": code, "message": message},
        },
        ensure_ascii=False,
    )
