"""Which fields a Batch API request body may hold, and which models it may name.

A batch runs the request it was given, or none: a field this server would not apply is refused
at validation with the line and the field named (`unsupported_field`), never dropped. Passed
through to llama-server: the sampling fields (`max_tokens`/`max_completion_tokens`,
`temperature`, `top_p`, `seed`, `stop`, `presence_penalty`, `frequency_penalty`, `logit_bias`),
`response_format` and `logprobs`/`top_logprobs`; `n` only as 1 (llama-server answers one
choice). Accepted and not sent, because they do not change the answer: `user`, `metadata`,
`store`, and `stream: false`.

Refused, with the reason: `tools`/`tool_choice` (and `parallel_tool_calls`, the older
`functions`/`function_call`). The bundled llama-server would apply them (its `--jinja` chat
templates are on by default), but an answer's tool calls would not reach the output line: the
ledger, the `distilled` row and the output writer keep an answer's text only.
"""

from __future__ import annotations

import itertools
from typing import Any

from kimi_batch.settings import Settings

__all__ = [
    "ACCEPTED_BODY_FIELDS",
    "check_logit_bias",
    "check_stops",
    "model_not_served",
    "refused_field",
    "served_models",
]

ACCEPTED_BODY_FIELDS = frozenset(
    {
        "model",
        "messages",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "seed",
        "stop",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "response_format",
        "logprobs",
        "top_logprobs",
        "n",
        "stream",
        # Bookkeeping OpenAI keeps; no effect on the answer.
        "user",
        "metadata",
        "store",
    }
)
_MESSAGE_FIELDS = frozenset({"role", "content"})
_TOOLS = frozenset({"tools", "tool_choice", "parallel_tool_calls", "functions", "function_call"})
_TOOLS_WHY = (
    "is not supported: tool calling is not run here (an answer's tool calls would not reach "
    "the output file: the run keeps an answer's text only)"
)


def refused_field(body: Any) -> tuple[str, str] | None:
    """(param, why) of the first field of `body` this server would not apply; None if none."""
    if not isinstance(body, dict):
        return None
    for name in body:
        if name in _TOOLS:
            return f"body.{name}", _TOOLS_WHY
        if name not in ACCEPTED_BODY_FIELDS:
            return f"body.{str(name)[:100]}", "is not supported by this server"
    n = body.get("n")
    if isinstance(n, int) and not isinstance(n, bool) and n > 1:
        return "body.n", "must be 1: llama-server answers one choice per request"
    messages = body.get("messages")
    for index, message in enumerate(messages if isinstance(messages, list) else []):
        for name in message if isinstance(message, dict) else ():
            if name not in _MESSAGE_FIELDS:
                return f"body.messages.{index}.{str(name)[:100]}", "is not supported here"
    return None


def served_models(settings: Settings) -> frozenset[str] | None:
    """The names a line's `model` may take, lowercased: the configured model file's stem (the
    `--alias` the resident server is started with), its file name and any `--alias` in
    `KIMI_BATCH_LLAMA_EXTRA_ARGS`. None (any name) for an attached server or no model: the
    name it serves is known only to it, and validation runs without a server."""
    if settings.llama_url or settings.model is None:
        return None
    names = {settings.model.name, settings.model.name.removesuffix(".gguf")}
    args = list(settings.llama_extra_args)
    names.update(value for flag, value in itertools.pairwise(args) if flag == "--alias")
    return frozenset(name.lower() for name in names)


def model_not_served(body: Any, models: frozenset[str] | None) -> str | None:
    """Why the line's `model` is not served; None when it is, or is absent (optional here)."""
    name = body.get("model") if isinstance(body, dict) else None
    if models is None or name is None or (isinstance(name, str) and name.lower() in models):
        return None
    served = ", ".join(sorted(models)) or "none"
    return f"the model {str(name)[:200]!r} does not exist here (served: {served})"


def check_stops(value: str | list[str] | None) -> str | list[str] | None:
    stops = [value] if isinstance(value, str) else value or []
    if len(stops) > 4 or not all(stops):
        raise ValueError("stop takes at most 4 non-empty strings")
    return value


def check_logit_bias(value: dict[str, float] | None) -> dict[str, float] | None:
    for token, bias in (value or {}).items():
        if not token.isdigit() or not -100 <= bias <= 100:
            raise ValueError("logit_bias maps token ids to biases in [-100, 100]")
    return value
