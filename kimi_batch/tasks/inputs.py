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
metadata columns next to the prompt. Files are read incrementally (`input_formats`) and the number
of quarantine rows per file is bounded, so memory stays small whatever lands in the inbox.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator

from kimi_batch.engine import SamplingParams
from kimi_batch.llama import ChatMessage
from kimi_batch.tasks.input_formats import (
    FILE_ERRORS,
    FileRefusedError,
    Item,
    check_text_encoding,
    csv_items,
    json_items,
    jsonl_items,
    parquet_items,
)
from kimi_batch.tasks.rows import QuarantineRow
from kimi_batch.tasks.seen_ids import SeenIds

__all__ = [
    "CHUNK_ROWS",
    "INSTRUCTIONS_CLOSE",
    "INSTRUCTIONS_OPEN",
    "MAX_INPUT_BYTES",
    "MAX_QUARANTINE_ROWS",
    "RAW_LIMIT",
    "SUPPORTED_EXTENSIONS",
    "InputBatch",
    "ParamOverrides",
    "SeedPrompt",
    "fold_instructions",
    "format_validation_error",
    "in_chunks",
    "input_row",
    "iter_inbox_rows",
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
# Defaults of the reader's bounds (the pipeline passes its configured size limit).
MAX_INPUT_BYTES = 256 << 20
MAX_QUARANTINE_ROWS = 1000
CHUNK_ROWS = 10_000
# A lone surrogate (from a JSON `\ud800` escape) is not Unicode: UTF-8 encoding of the request,
# the request key and the Parquet writer would all fail on it later.
_SURROGATE = re.compile("[\ud800-\udfff]")


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


def _unicode(value: str) -> str:
    if not value.isascii() and (found := _SURROGATE.search(value)):
        raise ValueError(
            f"has a lone surrogate {found.group()!r} at character {found.start()} (not valid "
            "Unicode: a broken escape or a mis-decoded file)"
        )
    return value


# Every string that is sent or stored goes through this check.
_Text = Annotated[str, AfterValidator(_unicode)]


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
        return value


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


def input_row(
    *,
    source_file: str,
    line: int | None,
    reason: str,
    raw: str,
    now: datetime,
    input_id: str | None,
) -> QuarantineRow:
    """An input row (or a whole file, `line` None) set aside with the reason."""
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
    text = json.dumps(record, ensure_ascii=False, default=str)
    # Lone surrogates stay escaped: `raw` is written to Parquet, which needs valid UTF-8.
    return (
        text if text.isascii() or not _SURROGATE.search(text) else json.dumps(record, default=str)
    )


def _shown(raw: Any, record: Any) -> str:
    """The `raw` column of a rejected row: its text as written, else its value as JSON."""
    if isinstance(raw, str):
        return raw
    try:
        return _raw_json(record if raw is None else raw)
    except (ValueError, RecursionError):
        return "(not shown: nested too deeply)"


# ---- the reader: decoded rows → seeds and (bounded) quarantine rows ---------------------------


class _Rejects:
    """Keeps the first `limit` quarantine rows of a file; counts the rest for one summary row."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.kept = 0
        self.dropped = 0
        self.examples: list[str] = []
        self._reasons: set[str] = set()

    def admit(self, line: int | None, reason: str) -> bool:
        if self.kept < self.limit:
            self.kept += 1
            return True
        self.dropped += 1
        if len(self.examples) < _MAX_REASONS and reason not in self._reasons:
            self._reasons.add(reason)
            self.examples.append(f"line {line}: {truncate_raw(reason, 200)}")
        return False

    def summary(self) -> str | None:
        if not self.dropped:
            return None
        return (
            f"{self.dropped} more bad rows not listed (only the first {self.limit} are), "
            f"e.g. {'; '.join(self.examples)}"
        )


def _open_regular(path: Path) -> tuple[IO[bytes], int]:
    """The open file and its size; refuses what is not a regular file before reading a byte."""
    # O_NONBLOCK: opening a FIFO named like an input must not hang the reader.
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode):
            raise FileRefusedError("not a regular file")
        return os.fdopen(descriptor, "rb"), status.st_size
    except BaseException:
        os.close(descriptor)
        raise


def _items(path: Path, file: IO[bytes], size: int) -> Iterator[Item]:
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return parquet_items(path)
    if suffix in (".jsonl", ".ndjson"):
        return jsonl_items(file)
    if suffix == ".json":
        return json_items(file, size=size)
    return csv_items(file)


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB"


def iter_inbox_rows(
    path: Path,
    *,
    source_name: str | None = None,
    now: datetime | None = None,
    max_input_bytes: int = MAX_INPUT_BYTES,
    max_quarantine_rows: int = MAX_QUARANTINE_ROWS,
) -> Iterator[SeedPrompt | QuarantineRow]:
    """Stream one inbox file as seeds and quarantine rows, in file order; never raises on content.

    Memory does not grow with the file: rows are decoded one at a time, a file over
    `max_input_bytes` is refused before it is read, only the first `max_quarantine_rows` bad rows
    are listed (then one row counting the rest), and duplicate ids are tracked as 8-byte digests.
    `source_name` (default: the file name) is stored as `source_file`; a bare name keeps rows
    identical when the inbox moves. Duplicate input ids keep their first row.
    """
    source = source_name or path.name
    created = now or datetime.now(UTC)
    rejects = _Rejects(max_quarantine_rows)
    seen = SeenIds()

    def row(line: int | None, reason: str, raw: str, input_id: str | None = None) -> QuarantineRow:
        return input_row(
            source_file=source, line=line, reason=reason, raw=raw, now=created, input_id=input_id
        )

    if path.suffix.lower() not in SUPPORTED_EXTENSIONS:
        yield row(None, f"unsupported file extension {path.suffix or '(none)'!r}", path.name)
        return
    file: IO[bytes] | None = None
    try:
        file, size = _open_regular(path)
        if size > max_input_bytes:
            raise FileRefusedError(
                f"file is {_mib(size)}, over the input limit of {_mib(max_input_bytes)} "
                "(KIMI_BATCH_MAX_INPUT_MB): split it into smaller files"
            )
        if size == 0:
            raise FileRefusedError("the file is empty (0 bytes); nothing to ingest")
        check_text_encoding(file, path.suffix)
        rows_read = 0
        for line, record, raw, decode_error in _items(path, file, size):
            rows_read += 1
            try:
                if decode_error is not None:
                    raise ValueError(decode_error)
                seed = _parse_record(record, source_file=source, line=line)
            except ValidationError as error:
                if rejects.admit(line, reason := format_validation_error(error)):
                    yield row(line, reason, _shown(raw, record))
                continue
            except (ValueError, RecursionError) as error:
                reason = (
                    str(error) if not isinstance(error, RecursionError) else "nested too deeply"
                )
                if rejects.admit(line, reason):
                    yield row(line, reason, _shown(raw, record))
                continue
            if not seen.add(seed.input_id, line):
                where = seen.first_line(seed.input_id)
                reason = f"duplicate input id {seed.input_id!r} (first on line {where})"
                if rejects.admit(line, reason):
                    yield row(line, reason, _shown(raw, record), seed.input_id)
                continue
            yield seed
        if rows_read == 0:
            yield row(None, "the file is empty (no rows, only blank lines or a header)", path.name)
    # Whatever stops the file from being read further becomes one row for the file: a broken
    # upload must not fail the partition (rows read before the error are kept).
    except FileRefusedError as error:
        yield row(None, f"file refused: {error}", path.name)
    except FILE_ERRORS as error:
        yield row(None, f"cannot read file: {type(error).__name__}: {error}", path.name)
    finally:
        if file is not None:
            file.close()
    if (summary := rejects.summary()) is not None:
        yield row(None, summary, path.name)


def in_chunks(
    rows: Iterable[SeedPrompt | QuarantineRow], *, chunk_rows: int = CHUNK_ROWS
) -> Iterator[InputBatch]:
    """`iter_inbox_rows`'s stream in batches of at most `chunk_rows` seeds (one Parquet part each).

    Each batch carries the quarantine rows met since the previous one; the last may hold no seeds.
    """
    seeds: list[SeedPrompt] = []
    quarantined: list[QuarantineRow] = []
    for item in rows:
        if isinstance(item, QuarantineRow):
            quarantined.append(item)
            continue
        seeds.append(item)
        if len(seeds) >= chunk_rows:
            yield InputBatch(seeds=seeds, quarantined=quarantined)
            seeds, quarantined = [], []
    if seeds or quarantined:
        yield InputBatch(seeds=seeds, quarantined=quarantined)


def read_inbox_file(
    path: Path,
    *,
    source_name: str | None = None,
    now: datetime | None = None,
    max_input_bytes: int = MAX_INPUT_BYTES,
    max_quarantine_rows: int = MAX_QUARANTINE_ROWS,
) -> InputBatch:
    """The whole of `iter_inbox_rows` in memory: for small files and tests."""
    rows = iter_inbox_rows(
        path,
        source_name=source_name,
        now=now,
        max_input_bytes=max_input_bytes,
        max_quarantine_rows=max_quarantine_rows,
    )
    return next(in_chunks(rows, chunk_rows=sys.maxsize), InputBatch(seeds=[], quarantined=[]))


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
            input_row(
                source_file=seed.source_file,
                line=seed.line,
                reason=f"prompt is {count} tokens, over the limit of {limit}",
                raw=raw,
                now=created,
                input_id=seed.input_id,
            )
        )
    return InputBatch(seeds=kept, quarantined=quarantined)
