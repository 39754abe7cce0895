"""Inbox files → validated seed prompts, and bad rows → quarantine rows with the reason.

Accepted formats (chosen by extension):

- `.jsonl` / `.ndjson`: one JSON object a line; each line is either a plain row
  (`id`?, `prompt` | `messages`, `system`?, `max_tokens`?, `temperature`?, `top_p`?, `seed`?)
  or an OpenAI Batch API input line (`custom_id`, `method`, `url`, `body`), told apart per line.
- `.json`: a JSON array of plain rows or OpenAI batch lines.
- `.parquet` and `.csv`: plain rows as columns (`messages` in a CSV cell is a JSON string).

Nothing here raises on bad input: a bad row, or a file that cannot be read at all, becomes a
`QuarantineRow` (stage `input`) with a short reason, the source file and the 1-based line, so one
broken upload never stops the batch. Unknown extra columns are ignored, so users can keep their own
metadata columns next to the prompt.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import polars as pl
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from kimi_batch.engine.requests import SamplingParams
from kimi_batch.llama.types import ChatMessage
from kimi_batch.tasks.rows import QuarantineRow

__all__ = [
    "INSTRUCTIONS_CLOSE",
    "INSTRUCTIONS_OPEN",
    "RAW_LIMIT",
    "SUPPORTED_EXTENSIONS",
    "InputBatch",
    "ParamOverrides",
    "SeedPrompt",
    "fold_instructions",
    "format_validation_error",
    "quarantine_overlong",
    "read_inbox_file",
    "truncate_raw",
]

SUPPORTED_EXTENSIONS: tuple[str, ...] = (".jsonl", ".ndjson", ".json", ".parquet", ".csv")
RAW_LIMIT = 2000
# A row-level system prompt is folded into the first user message between these markers: the
# fixed digest must stay the only system prefix (any byte before it breaks the prompt cache).
INSTRUCTIONS_OPEN = "<instructions>"
INSTRUCTIONS_CLOSE = "</instructions>"
_MAX_REASONS = 3


class ParamOverrides(BaseModel):
    """Per-row sampling overrides; unset fields keep the run's defaults."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_tokens: int | None = Field(default=None, gt=0)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    seed: int | None = None

    def apply(self, base: SamplingParams) -> SamplingParams:
        """`base` with the fields this row sets replaced (validated again as SamplingParams)."""
        return SamplingParams.model_validate(
            {**base.model_dump(), **self.model_dump(exclude_none=True)}
        )


class SeedPrompt(BaseModel):
    """One validated input row: what is sent (user side only) and where it came from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input_id: str = Field(min_length=1, description="Row `id`/`custom_id`, else a content hash.")
    messages: list[ChatMessage] = Field(
        min_length=1, description="User side only; instructions folded into the first user turn."
    )
    prompt: str = Field(min_length=1, description="The last user message as written (no block).")
    instructions: str | None = Field(
        default=None, description="The row's own system text, already folded into `messages`."
    )
    params: ParamOverrides = Field(default_factory=ParamOverrides)
    source_file: str
    line: int | None = Field(ge=1, description="1-based line (JSONL/CSV) or row number.")

    @field_validator("messages")
    @classmethod
    def _no_system_role(cls, messages: list[ChatMessage]) -> list[ChatMessage]:
        if any(message.role == "system" for message in messages):
            raise ValueError("system messages are not allowed (the digest is the only system)")
        if messages[-1].role != "user":
            raise ValueError("the last message must be from the user")
        return messages

    def sampling_params(self, base: SamplingParams) -> SamplingParams:
        """The run's params with this row's overrides applied."""
        return self.params.apply(base)


class InputBatch(BaseModel):
    """What one inbox file yielded: good seeds and quarantined rows."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seeds: list[SeedPrompt]
    quarantined: list[QuarantineRow]


# ---- raw row models (the boundary: what users may write) ------------------------------------


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


class _InMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    # `developer` is the OpenAI name of the system role in newer models.
    role: Literal["system", "developer", "user", "assistant"]
    content: str

    @field_validator("content", mode="before")
    @classmethod
    def _parts(cls, value: Any) -> Any:
        return _content_text(value)

    @field_validator("content")
    @classmethod
    def _not_empty(cls, value: str) -> str:
        if not value.strip():
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

    @field_validator("max_tokens", "temperature", "top_p", "seed", mode="before")
    @classmethod
    def _number(cls, value: Any) -> Any:
        return _no_bool(value)

    def overrides(self) -> ParamOverrides:
        return ParamOverrides(
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self.seed,
        )


class _PlainRow(_Overrides):
    id: str | None = None
    prompt: str | None = None
    messages: list[_InMessage] | None = None
    system: str | None = None

    @field_validator("id", mode="before")
    @classmethod
    def _id(cls, value: Any) -> Any:
        # Ids may be numbers in JSON/Parquet; a bool or a float is almost always a mistake.
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise ValueError("must be a string or an integer")
        text = str(value).strip()
        if not text:
            raise ValueError("must not be empty")
        return text

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
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

    custom_id: str = Field(min_length=1)
    method: Literal["POST"] = "POST"
    url: Literal["/v1/chat/completions"]
    body: _OpenAIBody


# ---- helpers -----------------------------------------------------------------------------------


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
        parts.append(f"{location}: {message}" if location else message)
    if error.error_count() > _MAX_REASONS:
        parts.append(f"and {error.error_count() - _MAX_REASONS} more")
    return "; ".join(parts)


def fold_instructions(instructions: str | None, content: str) -> str:
    """Put a row's own system text in front of a user message as a clearly marked block."""
    if not instructions or not instructions.strip():
        return content
    return f"{INSTRUCTIONS_OPEN}\n{instructions.strip()}\n{INSTRUCTIONS_CLOSE}\n\n{content}"


def truncate_raw(text: str, limit: int = RAW_LIMIT) -> str:
    """`text` cut to `limit` characters (an ellipsis marks the cut) for the `raw` column."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


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


def _parse_record(record: Any, *, source_file: str, line: int | None) -> SeedPrompt:
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


def _quarantine(
    *,
    source_file: str,
    line: int | None,
    reason: str,
    raw: str,
    now: datetime,
    input_id: str | None,
) -> QuarantineRow:
    return QuarantineRow(
        request_id=None,
        input_id=input_id,
        model=None,
        digest_sha256=None,
        stage="input",
        source_file=source_file,
        line=line,
        reason=reason,
        raw=truncate_raw(raw),
        created_at=now,
    )


def _raw_json(record: Any) -> str:
    return json.dumps(record, ensure_ascii=False, default=str)


# ---- readers: yield (line, decoded record | error reason, raw text) ---------------------------

_Item = tuple[int | None, Any, str, str | None]  # line, record, raw, decode error


def _jsonl_items(data: bytes) -> Iterator[_Item]:
    for number, raw_bytes in enumerate(data.split(b"\n"), start=1):
        try:
            text = raw_bytes.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError:
            yield number, None, repr(raw_bytes[:RAW_LIMIT]), "line is not valid UTF-8"
            continue
        text = text.strip()
        if not text:
            continue
        try:
            yield number, json.loads(text), text, None
        except json.JSONDecodeError as error:
            yield number, None, text, f"invalid JSON: {error.msg} (column {error.colno})"


def _json_items(data: bytes) -> Iterator[_Item]:
    records = json.loads(data.decode("utf-8-sig"))
    if not isinstance(records, list):
        raise ValueError(f"expected a JSON array of rows, got {type(records).__name__}")
    for number, record in enumerate(records, start=1):
        yield number, record, _raw_json(record), None


def _require_prompt_column(columns: Iterable[str]) -> None:
    if not {"prompt", "messages"} & set(columns):
        raise ValueError("no `prompt` or `messages` column")


def _csv_items(data: bytes) -> Iterator[_Item]:
    reader = csv.DictReader(io.StringIO(data.decode("utf-8-sig"), newline=""))
    _require_prompt_column(reader.fieldnames or [])
    line = 2  # line 1 is the header
    for row in reader:
        raw = _raw_json(row)
        if None in row:
            yield line, None, raw, "row has more fields than the header"
        else:
            record = {k: v for k, v in row.items() if v not in (None, "")}
            # An empty cell means "not set", but an empty prompt in a row without messages is the
            # user's mistake and should be reported as such, not as a missing column.
            if "prompt" in row and "messages" not in record:
                record.setdefault("prompt", row["prompt"])
            yield line, record, raw, None
        line = reader.line_num + 1  # a quoted field may span lines


def _parquet_items(path: Path) -> Iterator[_Item]:
    frame = pl.read_parquet(path)
    _require_prompt_column(frame.columns)
    for number, record in enumerate(frame.iter_rows(named=True), start=1):
        # Columns a row does not use are null there (e.g. `prompt` in a `messages` row).
        present = {key: value for key, value in record.items() if value is not None}
        yield number, present, _raw_json(present), None


def _items(path: Path) -> Iterator[_Item]:
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return _parquet_items(path)
    data = path.read_bytes()
    if suffix in (".jsonl", ".ndjson"):
        return _jsonl_items(data)
    if suffix == ".json":
        return _json_items(data)
    return _csv_items(data)


def read_inbox_file(
    path: Path, *, source_name: str | None = None, now: datetime | None = None
) -> InputBatch:
    """Read one inbox file into seeds and quarantine rows; never raises on bad content.

    `source_name` (default: the file name) is stored as `source_file`; a bare name keeps rows
    identical when the inbox moves. Duplicate input ids keep their first row.
    """
    source = source_name or path.name
    created = now or datetime.now(UTC)
    seeds: list[SeedPrompt] = []
    quarantined: list[QuarantineRow] = []
    first_line: dict[str, int | None] = {}

    def reject(line: int | None, reason: str, raw: str, input_id: str | None = None) -> None:
        quarantined.append(
            _quarantine(
                source_file=source,
                line=line,
                reason=reason,
                raw=raw,
                now=created,
                input_id=input_id,
            )
        )

    if path.suffix.lower() not in SUPPORTED_EXTENSIONS:
        reject(None, f"unsupported file extension {path.suffix or '(none)'!r}", path.name)
        return InputBatch(seeds=[], quarantined=quarantined)
    try:
        for line, record, raw, decode_error in _items(path):
            if decode_error is not None:
                reject(line, decode_error, raw)
                continue
            try:
                seed = _parse_record(record, source_file=source, line=line)
            except ValidationError as error:
                reject(line, format_validation_error(error), raw)
                continue
            except ValueError as error:
                reject(line, str(error), raw)
                continue
            if seed.input_id in first_line:
                where = first_line[seed.input_id]
                reason = f"duplicate input id {seed.input_id!r} (first on line {where})"
                reject(line, reason, raw, seed.input_id)
                continue
            first_line[seed.input_id] = line
            seeds.append(seed)
    # Whatever stops the file from being read at all becomes one row for the file: a broken
    # upload must not fail the partition (rows read before a mid-file CSV error are kept).
    except (OSError, UnicodeError, ValueError, csv.Error, pl.exceptions.PolarsError) as error:
        reject(None, f"cannot read file: {type(error).__name__}: {error}", path.name)
    return InputBatch(seeds=seeds, quarantined=quarantined)


def quarantine_overlong(
    seeds: Sequence[SeedPrompt],
    token_counts: Mapping[str, int],
    limit: int,
    *,
    now: datetime | None = None,
) -> InputBatch:
    """Split seeds by prompt length in tokens (`token_counts` by input id, from the server).

    `limit` is what fits: context per slot minus the digest and the answer budget. A seed
    without a count is a caller bug, so it raises instead of guessing.
    """
    missing = [seed.input_id for seed in seeds if seed.input_id not in token_counts]
    if missing:
        raise ValueError(f"no token count for input ids: {', '.join(missing[:5])}")
    created = now or datetime.now(UTC)
    kept: list[SeedPrompt] = []
    quarantined: list[QuarantineRow] = []
    for seed in seeds:
        count = token_counts[seed.input_id]
        if count <= limit:
            kept.append(seed)
            continue
        raw = _raw_json([message.model_dump() for message in seed.messages])
        quarantined.append(
            _quarantine(
                source_file=seed.source_file,
                line=seed.line,
                reason=f"prompt is {count} tokens, over the limit of {limit}",
                raw=raw,
                now=created,
                input_id=seed.input_id,
            )
        )
    return InputBatch(seeds=kept, quarantined=quarantined)
