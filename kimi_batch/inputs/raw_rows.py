"""What users may write in an input row (the boundary), and one decoded row -> a `SeedPrompt`.

A row is either a plain row (`id`?, `prompt` | `messages`, `system`?, `max_tokens`?,
`temperature`?, `top_p`?, `seed`?, `tools`? (OpenAI function tools, kept with the answer for
training exports; a JSON string in a CSV cell)) or an OpenAI Batch API input line (`custom_id`, `method`,
`url`, `body`), told apart per row. Unknown extra columns are ignored, so users can keep their own
metadata next to the prompt. A row's system text is folded into its first user message
(`engine.fold_instructions`): the digest stays the only system prefix.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from kimi_batch.engine import fold_instructions
from kimi_batch.inputs.prompts import ParamOverrides, SeedPrompt
from kimi_batch.inputs.tools import FunctionTool, UnicodeText
from kimi_batch.llama import ChatMessage

_MAX_REASONS = 3
# The tables store integers as signed 64-bit (BIGINT): a larger value could not be written, and
# one such row would fail the write of every other row of its partition.
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def _content_text(value: Any) -> Any:
    """OpenAI content may be a string or a list of parts; only text parts are usable here."""
    if isinstance(value, list):
        texts: list[str] = []
        for part in value:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise ValueError("only text content parts are supported")
            text = part.get("text")
            if not isinstance(text, str):
                raise ValueError("text part without a string `text`")
            texts.append(text)
        return "\n".join(texts)
    return value


# Every string that is sent or stored goes through this check (a tool's too: `tools`).
_Text = UnicodeText


class _InMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    # `developer` is the OpenAI name of the system role in newer models.
    role: Literal["system", "developer", "user", "assistant"]
    content: _Text

    @field_validator("content", mode="before")
    @classmethod
    def _parts(cls, value: Any) -> Any:
        return _content_text(value)

    @field_validator("content")
    @classmethod
    def _not_empty(cls, value: str) -> str:
        if _blank(value):
            raise ValueError("must not be empty")
        return value


def _messages_before(value: Any) -> Any:
    # A CSV cell can only hold text, so `messages` arrives there as a JSON string.
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as error:
            raise ValueError(f"not a JSON list of messages ({error.msg})") from error
    return value


def _nonempty_messages(value: list[_InMessage] | None) -> list[_InMessage] | None:
    if value is not None and not value:
        raise ValueError("must not be empty")
    return value


def _bounded(value: int | None) -> int | None:
    if value is not None and not _INT64_MIN <= value <= _INT64_MAX:
        raise ValueError(f"must be a 64-bit integer (between {_INT64_MIN} and {_INT64_MAX})")
    return value


def _blank(text: str) -> bool:
    """Nothing a reader sees: whitespace and invisible format characters only (a zero-width
    space, a byte order mark, a soft hyphen), which `str.strip` keeps."""
    return all(ch.isspace() or unicodedata.category(ch) == "Cf" for ch in text)


def _no_nul(value: str) -> str:
    # PostgreSQL text cannot hold U+0000: an id holding one could not be recorded or looked up.
    if "\x00" in value:
        at = value.index("\x00")
        raise ValueError(f"must not contain U+0000 (a NUL character; at character {at})")
    return value


def _no_bool(value: Any) -> Any:
    # Lax pydantic reads `true` as 1; as a sampling setting it is a mistake, not a number.
    if isinstance(value, bool):
        raise ValueError("must be a number, not a boolean")
    return value


class _Overrides(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    max_tokens: int | None = Field(default=None, gt=0)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    seed: int | None = None
    # Kept with the row's answer, so a training export gives the trainer the tools too.
    tools: list[FunctionTool] | None = Field(default=None, min_length=1, max_length=128)

    @field_validator("tools", mode="before")
    @classmethod
    def _tools_json(cls, value: Any) -> Any:
        # A CSV cell can only hold text: `tools` arrives there as a JSON string.
        if isinstance(value, str):
            try:
                return json.loads(value)
            except json.JSONDecodeError as error:
                raise ValueError(f"not a JSON list of tools ({error.msg})") from error
        return value

    @field_validator("max_tokens", "temperature", "top_p", "seed", mode="before")
    @classmethod
    def _number(cls, value: Any) -> Any:
        return _no_bool(value)

    @field_validator("max_tokens", "seed")
    @classmethod
    def _int64(cls, value: int | None) -> int | None:
        return _bounded(value)

    def overrides(self) -> ParamOverrides:
        return ParamOverrides(
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self.seed,
            tools=[tool.model_dump(exclude_none=True) for tool in self.tools]
            if self.tools
            else None,
        )


class _PlainRow(_Overrides):
    id: _Text | None = None
    prompt: _Text | None = None
    messages: list[_InMessage] | None = None
    system: _Text | None = None

    @field_validator("id", mode="before")
    @classmethod
    def _id(cls, value: Any) -> Any:
        # Ids may be numbers in JSON/Parquet; a bool or a float is almost always a mistake.
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise ValueError("must be a string or an integer")
        text = str(value).strip()
        if _blank(text):
            raise ValueError("must not be empty")
        return _no_nul(text)

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, value: str | None) -> str | None:
        if value is not None and _blank(value):
            raise ValueError("must not be empty")
        return value

    @field_validator("messages", mode="before")
    @classmethod
    def _messages_json(cls, value: Any) -> Any:
        return _messages_before(value)

    @field_validator("messages")
    @classmethod
    def _messages(cls, value: list[_InMessage] | None) -> list[_InMessage] | None:
        return _nonempty_messages(value)

    def conversation(self) -> list[_InMessage]:
        """The row as messages, its `system` text first (folded later like any system turn)."""
        if self.prompt is not None and self.messages is not None:
            raise ValueError("give either prompt or messages, not both")
        system = self.system.strip() if self.system else ""
        head = [_InMessage(role="system", content=system)] if system else []
        if self.messages is not None:
            return head + self.messages
        if self.prompt is None:
            raise ValueError("either prompt or messages is required")
        return [*head, _InMessage(role="user", content=self.prompt)]


class _OpenAIBody(_Overrides):
    messages: list[_InMessage]
    # The newer name of max_tokens in the OpenAI API; wins when both are set.
    max_completion_tokens: int | None = Field(default=None, gt=0)

    @field_validator("max_completion_tokens", mode="before")
    @classmethod
    def _completion_number(cls, value: Any) -> Any:
        return _no_bool(value)

    @field_validator("messages")
    @classmethod
    def _messages(cls, value: list[_InMessage]) -> list[_InMessage]:
        return _nonempty_messages(value) or value

    def overrides(self) -> ParamOverrides:
        base = super().overrides()
        if self.max_completion_tokens is None:
            return base
        return base.model_copy(update={"max_tokens": self.max_completion_tokens})


class _OpenAIBatchLine(BaseModel):
    """An OpenAI Batch API input line; `body.model` and other body keys are ignored (one server)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    # No `min_length`: pydantic's constrained str would reject a lone surrogate with a vaguer text.
    custom_id: _Text
    method: Literal["POST"] = "POST"
    url: Literal["/v1/chat/completions"]
    body: _OpenAIBody

    @field_validator("custom_id")
    @classmethod
    def _custom_id(cls, value: str) -> str:
        if not value:
            raise ValueError("String should have at least 1 character")
        if _blank(value):  # kept as written (the answer names it), but it must name something
            raise ValueError("must not be blank")
        return _no_nul(value)


# ---- one row -----------------------------------------------------------------------------------


def format_validation_error(error: ValidationError) -> str:
    """A short, human-readable reason such as `prompt: must not be empty`."""
    parts: list[str] = []
    for item in error.errors()[:_MAX_REASONS]:
        location = ""
        for key in item["loc"]:
            location += f"[{key}]" if isinstance(key, int) else (f".{key}" if location else key)
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] in ("model_type", "dict_type"):
            message = "must be a JSON object"  # pydantic would name a private class here
        elif item["type"] == "extra_forbidden":
            message = "is not supported by this server (refused, not ignored)"
        parts.append(f"{location}: {message}" if location else message)
    if error.error_count() > _MAX_REASONS:
        parts.append(f"and {error.error_count() - _MAX_REASONS} more")
    return "; ".join(parts)


def _content_hash(messages: list[ChatMessage], params: ParamOverrides) -> str:
    # Content, not bytes of the line: the same prompt gets the same id in any format and on rerun.
    canonical = json.dumps(
        {
            "messages": [message.model_dump(mode="json") for message in messages],
            "params": params.model_dump(mode="json", exclude_none=True),
        },
        sort_keys=True,
        ensure_ascii=False,
        separators=(",", ":"),
    )
    return "h-" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


def _build_seed(
    *,
    input_id: str | None,
    conversation: list[_InMessage],
    params: ParamOverrides,
    source_file: str,
    line: int | None,
) -> SeedPrompt:
    system_texts = [m.content.strip() for m in conversation if m.role in ("system", "developer")]
    instructions = "\n\n".join(system_texts) or None
    turns = [m for m in conversation if m.role not in ("system", "developer")]
    if not any(m.role == "user" for m in turns):
        raise ValueError("messages: needs at least one user message")
    if turns[-1].role != "user":
        raise ValueError("messages: the last message must be from the user")
    first_user = next(index for index, m in enumerate(turns) if m.role == "user")
    messages = [
        ChatMessage(
            role="user" if m.role == "user" else "assistant",
            content=fold_instructions(instructions, m.content) if i == first_user else m.content,
        )
        for i, m in enumerate(turns)
    ]
    return SeedPrompt(
        input_id=input_id or _content_hash(messages, params),
        messages=messages,
        prompt=turns[-1].content,
        instructions=instructions,
        params=params,
        source_file=source_file,
        line=line,
    )


def parse_record(record: Any, *, source_file: str, line: int | None) -> SeedPrompt:
    """Validate one decoded row; raises ValueError/ValidationError with the reason."""
    if not isinstance(record, Mapping):
        raise ValueError(f"row must be a JSON object, got {type(record).__name__}")
    if "custom_id" in record and "body" in record:
        batch_line = _OpenAIBatchLine.model_validate(record)
        return _build_seed(
            input_id=batch_line.custom_id,
            conversation=batch_line.body.messages,
            params=batch_line.body.overrides(),
            source_file=source_file,
            line=line,
        )
    row = _PlainRow.model_validate(record)
    return _build_seed(
        input_id=row.id,
        conversation=row.conversation(),
        params=row.overrides(),
        source_file=source_file,
        line=line,
    )
