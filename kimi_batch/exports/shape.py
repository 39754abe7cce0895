"""One answer as a trainer's row: the options (`TrainingOptions`) and the row they shape.

- reasoning `field` (default): the assistant message's `reasoning_content`, the key the chat
  templates of Qwen3, DeepSeek-R1-style and Kimi models read; `inline`: wrapped in the think
  tags at the head of `content`; `drop`: left out (`TrainingOptions.card_notes` says so).
- tool calls: the assistant message's `tool_calls` in OpenAI's shape (`id`, `type`,
  `function.name`, `function.arguments` as JSON text); the request's tools: the row's `tools`
  column (OpenAI function tools), only on rows whose request had tools (TRL's tool datasets).
- layout `messages`: `{"messages": [...]}` (TRL conversational); `prompt-completion`:
  `{"prompt": [...], "completion": [assistant]}` (TRL conversational prompt-completion, what
  completion-only loss reads).
- system turn `keep` (default): the digest as the first message; `drop`: no system turn;
  `once`: no system turn, the row's `system_sha256` names the digest, whose text is written
  once in the side file (`system_side_file`) beside the export.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

ReasoningPlacement = Literal["field", "inline", "drop"]
Layout = Literal["messages", "prompt-completion"]
SystemTurn = Literal["keep", "drop", "once"]


class TrainingOptions(BaseModel):
    """How a training export shapes its rows (`--reasoning`, `--layout`, `--system`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reasoning: ReasoningPlacement = "field"
    layout: Layout = "messages"
    system_turn: SystemTurn = "keep"
    think_tags: tuple[str, str] = ("<think>", "</think>")

    @property
    def card_notes(self) -> list[str]:
        """What the dataset card says about the rows' shape (read by the card)."""
        reasoning = {
            "field": "The teacher's reasoning is the assistant message's `reasoning_content`.",
            "inline": f"The teacher's reasoning opens the assistant `content`, inside "
            f"{self.think_tags[0]}...{self.think_tags[1]}.",
            "drop": "The teacher's reasoning was dropped from this export (--reasoning drop).",
        }[self.reasoning]
        system = {
            "keep": "Every conversation opens with the system digest it was answered under.",
            "drop": "The system digest was left out of the conversations (--system drop).",
            "once": "The system digest is stored once beside the rows (`system.json`); each "
            "row's `system_sha256` names it (--system once).",
        }[self.system_turn]
        return [reasoning, system, f"Layout: {self.layout} (TRL conversational)."]


def _tool_calls(calls_json: str | None) -> list[dict[str, Any]]:
    return [
        {
            "id": call["id"],
            "type": call.get("type", "function"),
            "function": {
                "name": call["function"]["name"],
                "arguments": call["function"]["arguments"],
            },
        }
        for call in json.loads(calls_json or "[]")
    ]


def assistant_message(
    content: str, reasoning: str | None, tool_calls: str | None, options: TrainingOptions
) -> dict[str, Any]:
    """The answer as the assistant message a chat template reads."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning and options.reasoning == "field":
        message["reasoning_content"] = reasoning
    elif reasoning and options.reasoning == "inline":
        opening, closing = options.think_tags
        message["content"] = f"{opening}\n{reasoning.strip()}\n{closing}\n\n{content}"
    calls = _tool_calls(tool_calls)
    if calls:
        message["tool_calls"] = calls
    return message


def trainer_row(
    asked: list[dict[str, Any]],
    answer: dict[str, Any],
    *,
    digest_sha256: str,
    tools: str | None,
    options: TrainingOptions,
) -> dict[str, Any]:
    """The row: `asked` (the system turn, if any, then the user side) and the `answer` message
    laid out as `options` say, with the request's `tools` when it had some."""
    if options.system_turn != "keep" and asked and asked[0]["role"] == "system":
        asked = asked[1:]
    row: dict[str, Any] = (
        {"messages": [*asked, answer]}
        if options.layout == "messages"
        else {"prompt": asked, "completion": [answer]}
    )
    if tools:
        row["tools"] = json.loads(tools)
    if options.system_turn == "once":
        row["system_sha256"] = digest_sha256
    return row


def system_side_file(export: Path) -> Path:
    """Where `--system once` writes the digests (sha256 -> text) beside an export file."""
    return export.with_name(export.name + ".system.json")
