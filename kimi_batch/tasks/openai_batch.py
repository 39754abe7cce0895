"""OpenAI Batch API lines: a validated input line, a line's error, and the output and error lines.

Input (`/v1/batches`): one JSON object a line, `{custom_id, method, url, body}`, validated by
`tasks.batch_input` into `BatchRequestLine`s or `BatchLineError`s. A batch is answered exactly
as submitted: a chat line's leading system (or developer) message is the batch's own digest
(prefilled once, saved and restored into every slot, like the pipeline's), the other messages
are sent as they are, and the body's fields become the request's params. A completion line
(`/v1/completions`) is a raw prompt, sent as it is: no digest, no chat template.

Output: one writer (`response_line`, `error_line`) for the API's output and error files and for
`kimi-batch export`: a `chat.completion` body (tool calls included) for a chat line, a
`text_completion` body for a completion line, as OpenAI's batch output has them.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.engine import GenerationRequest, GenerationResult, RequestKind, SamplingParams
from kimi_batch.llama import ChatMessage, TokenLogprob, ToolCall
from kimi_batch.tasks.tags import RequestTag

__all__ = [
    "API_STAGE",
    "BATCH_ENDPOINTS",
    "CHAT_COMPLETIONS_URL",
    "COMPLETIONS_URL",
    "MAX_LISTED_ERRORS",
    "AnsweredRequest",
    "BatchInput",
    "BatchLineError",
    "BatchRequestLine",
    "error_line",
    "response_line",
]

CHAT_COMPLETIONS_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"
BATCH_ENDPOINTS: dict[str, RequestKind] = {
    CHAT_COMPLETIONS_URL: "chat",
    COMPLETIONS_URL: "completion",
}
"""The endpoints a batch may name, and the kind of request each line of it is."""
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
    kind: RequestKind = Field(default="chat", description="`completion`: a /v1/completions line.")

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
            kind=self.kind,
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


def response_line(
    answer: AnsweredRequest, *, top_logprobs: int | None = None, kind: RequestKind = "chat"
) -> str:
    """The output-file line of a finished request: a chat completion, or for a completion
    line a `text_completion`, as OpenAI returns them.

    `top_logprobs`: how many alternatives the request asked for (None: all that were kept).
    An answer cut off at max_tokens is a success with `finish_reason: "length"`.
    """
    if kind == "completion":
        logprobs = answer.logprobs
        choice: dict[str, Any] = {
            "text": answer.content,
            "index": 0,
            "logprobs": _text_logprobs(logprobs, top_logprobs) if logprobs else None,
            "finish_reason": answer.finish_reason,
        }
        head = {"id": f"cmpl-{answer.request_id}", "object": "text_completion"}
    else:
        choice = _chat_choice(answer, top_logprobs)
        head = {"id": f"chatcmpl-{answer.request_id}", "object": "chat.completion"}
    body = {
        **head,
        "created": _epoch(answer.created_at),
        "model": answer.model,
        "choices": [choice],
        "usage": _usage(answer),
    }
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
