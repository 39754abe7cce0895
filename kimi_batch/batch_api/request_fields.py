"""Which fields a Batch API request body may hold, and which models it may name.

A batch runs the request it was given, or none: a field this server would not apply is refused
at validation with the line and the field named (`unsupported_field`), never dropped.

Chat lines (`/v1/chat/completions`) pass through to llama-server: the sampling fields
(`max_tokens`/`max_completion_tokens`, `temperature`, `top_p`, `seed`, `stop`,
`presence_penalty`, `frequency_penalty`, `logit_bias`), `response_format`,
`logprobs`/`top_logprobs`, and the tools (`tools`, `tool_choice` as `none`/`auto`/`required`,
`parallel_tool_calls`: the bundled server renders them with the model's chat template, its
`--jinja` default, and the answer's tool calls reach the output line; a server whose template
renders no tools gets no such request, the client refuses it in the run). Refused: a
`tool_choice` naming a function (llama-server reads only the three strings and would quietly
run `auto`), the older `functions`/`function_call` (llama-server ignores them), and messages
holding tool calls or tool results (a conversation is text turns here).

Completion lines (`/v1/completions`) pass through `prompt` (one string), the same sampling
fields (`max_tokens`), and `logprobs` (an integer); `echo` only as false and `best_of` only as
1 (llama-server applies neither), `suffix` is refused (it would be ignored).

Responses lines (`/v1/responses`) run as the chat request llama-server's own /v1/responses
makes of them: `instructions` (the system turn), `input` (a string, or message items of text
parts), `max_output_tokens`, `temperature`, `top_p`, `text.format` (text, json_object,
json_schema), and function `tools` (flat, as the Responses API writes them) with `tool_choice`
and `parallel_tool_calls`. Refused: `previous_response_id` (no response is stored here: a line
stands alone), input items other than messages, and every other field.

Inside the fields, every object is a body model (`request_bodies`) that refuses a key it does
not list (`text.verbosity`, a misspelt `text.fromat`, `response_format.schema`), named by its
path; only a JSON schema and a tool's `parameters` are free-form, and they are sent as given.

All: `n` only as 1 (one choice per request). Accepted and not sent, because they do not
change the answer: `user`, `metadata`, `store`, and `stream: false`.
"""

from __future__ import annotations

import itertools
from typing import Any

from kimi_batch.batch_api.lines import LineKind
from kimi_batch.batch_api.request_bodies import body_fields
from kimi_batch.settings import Settings

# Bookkeeping OpenAI keeps; no effect on the answer.
_BOOKKEEPING = frozenset({"user", "metadata", "store", "stream"})
# A chat or completion line may hold what its body model declares, and the bookkeeping. A
# Responses line is listed: its model inherits the sampling fields both other endpoints take,
# of which the Responses API has only these (the others are refused, not dropped).
ACCEPTED_BODY_FIELDS: dict[LineKind, frozenset[str]] = {
    "chat": body_fields("chat") | _BOOKKEEPING,
    "completion": body_fields("completion") | _BOOKKEEPING,
    "responses": _BOOKKEEPING
    | {
        "model",
        "input",
        "instructions",
        "max_output_tokens",
        "temperature",
        "top_p",
        "text",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
    },
}
_MESSAGE_FIELDS = frozenset({"role", "content"})
_INPUT_ITEM_FIELDS = frozenset({"type", "role", "content"})
_WHY: dict[str, str] = {
    "functions": "is not supported: llama-server does not apply the deprecated "
    "functions/function_call; send them as tools/tool_choice",
    "suffix": "is not supported: llama-server's /v1/completions does not insert a suffix",
    "tool_calls": "is not supported here: a conversation is text turns (a model's tool calls "
    "come back in the output line; a line carrying them or their results cannot be sent)",
}
_WHY["previous_response_id"] = (
    "is not supported: no response is stored here, so a line stands alone (send the whole "
    "conversation as input items)"
)
_WHY["function_call"] = _WHY["functions"]
_WHY["tool_call_id"] = _WHY["tool_calls"]


def _refused_value(body: dict[Any, Any], kind: LineKind) -> tuple[str, str] | None:
    """A field accepted only with OpenAI's default, or in one shape, holding another value."""
    n, best_of = body.get("n"), body.get("best_of")
    if isinstance(n, int) and not isinstance(n, bool) and n > 1:
        return "body.n", "must be 1: llama-server answers one choice per request"
    if isinstance(best_of, int) and not isinstance(best_of, bool) and best_of > 1:
        return "body.best_of", "must be 1: llama-server samples one answer per request"
    if body.get("echo") is True:
        return "body.echo", "must be false: llama-server does not echo the prompt"
    if kind == "completion" and isinstance(body.get("prompt"), list):
        return "body.prompt", (
            "must be one string: a list of prompts or token ids is not supported (one line "
            "per prompt)"
        )
    if kind == "responses":
        refused = _refused_responses_value(body)
        if refused is not None:
            return refused
    if isinstance(body.get("tool_choice"), dict):
        return "body.tool_choice", (
            "must be 'none', 'auto' or 'required': llama-server does not force a named "
            "function (send only that tool, with 'required')"
        )
    return None


def _refused_responses_value(body: dict[Any, Any]) -> tuple[str, str] | None:
    """A Responses input item that is not a message, or a tool that is not a function."""
    items = body.get("input")
    for index, item in enumerate(items if isinstance(items, list) else []):
        kind = item.get("type", "message") if isinstance(item, dict) else "message"
        if kind != "message":
            return f"body.input.{index}.type", (
                f"{str(kind)[:100]!r} is not supported: input items are messages of text here "
                "(no tool calls or their outputs, files or images)"
            )
    tools = body.get("tools")
    for index, tool in enumerate(tools if isinstance(tools, list) else []):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            return f"body.tools.{index}.type", (
                f"{str(kind)[:100]!r} is not supported: llama-server runs function tools only "
                "(no built-in tools)"
            )
    return None


def refused_field(body: Any, kind: LineKind = "chat") -> tuple[str, str] | None:
    """(param, why) of the first field of `body` this server would not apply to a request of
    `kind`; None if none."""
    if not isinstance(body, dict):
        return None
    accepted = ACCEPTED_BODY_FIELDS[kind]
    for name in body:
        if name not in accepted:
            why = _WHY.get(name, "is not supported by this server")
            return f"body.{str(name)[:100]}", why
    refused = _refused_value(body, kind)
    if refused is not None:
        return refused
    field, allowed = (
        ("input", _INPUT_ITEM_FIELDS) if kind == "responses" else ("messages", _MESSAGE_FIELDS)
    )
    messages = body.get(field)
    for index, message in enumerate(messages if isinstance(messages, list) else []):
        for name in message if isinstance(message, dict) else ():
            if name not in allowed:
                why = _WHY.get(name, "is not supported here")
                return f"body.{field}.{index}.{str(name)[:100]}", why
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
