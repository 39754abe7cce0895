"""Reading an input file: formats, bounded reads, chunks of seeds and quarantine rows.

Accepted formats (chosen by extension): `.jsonl` / `.ndjson` (one JSON object a line), `.json`
(a JSON array), `.parquet` and `.csv` (rows as columns; `messages` in a CSV cell is a JSON
string); the decoders are in `formats`, what a row may hold in `raw_rows`.

Nothing here raises on bad input: a bad row, or a file that cannot be read at all, becomes a
`QuarantineRow` (stage `input`) with a short reason, the source file and the 1-based line, so one
broken upload never stops the batch. Files are read incrementally and the number of quarantine
rows per file is bounded, so memory stays small whatever lands in the inbox.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kimi_batch.inputs.formats import (
    FILE_ERRORS,
    FileRefusedError,
    Item,
    check_text_encoding,
    csv_items,
    json_items,
    jsonl_items,
    parquet_items,
)
from kimi_batch.inputs.prompts import InputBatch, SeedPrompt
from kimi_batch.inputs.raw_rows import format_validation_error, parse_record
from kimi_batch.inputs.seen_ids import SeenIds
from kimi_batch.pipeline import QuarantineRow, input_row, rejected_raw, truncate_raw
from kimi_batch.storage import NotRegularFileError, open_regular

SUPPORTED_EXTENSIONS: tuple[str, ...] = (".jsonl", ".ndjson", ".json", ".parquet", ".csv")
# Defaults of the reader's bounds (the pipeline passes its configured size limit).
MAX_INPUT_BYTES = 256 << 20
MAX_QUARANTINE_ROWS = 1000
CHUNK_ROWS = 10_000
_MAX_EXAMPLES = 3


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
        if len(self.examples) < _MAX_EXAMPLES and reason not in self._reasons:
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
    try:
        file = open_regular(path)
    except NotRegularFileError as error:
        raise FileRefusedError("not a regular file") from error
    return file, os.fstat(file.fileno()).st_size


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


class _RowMaker(Protocol):
    """Makes the file's quarantine row for one reason (`iter_inbox_rows`' `row`)."""

    def __call__(
        self, line: int | None, reason: str, raw: str, input_id: str | None = None
    ) -> QuarantineRow: ...


def _file_rows(
    path: Path, file: IO[bytes], size: int, source: str, rejects: _Rejects, row: _RowMaker
) -> Iterator[SeedPrompt | QuarantineRow]:
    """The rows of an opened, size-checked file: each decoded and validated, a bad one or a
    repeated input id a quarantine row (`row`) while `rejects` admits more."""
    seen = SeenIds()
    rows_read = 0
    for line, record, raw, decode_error in _items(path, file, size):
        rows_read += 1
        try:
            if decode_error is not None:
                raise ValueError(decode_error)
            seed = parse_record(record, source_file=source, line=line)
        except ValidationError as error:
            if rejects.admit(line, reason := format_validation_error(error)):
                yield row(line, reason, rejected_raw(raw, record))
            continue
        except (ValueError, RecursionError) as error:
            reason = str(error) if not isinstance(error, RecursionError) else "nested too deeply"
            if rejects.admit(line, reason):
                yield row(line, reason, rejected_raw(raw, record))
            continue
        if not seen.add(seed.input_id, line):
            where = seen.first_line(seed.input_id)
            reason = f"duplicate input id {seed.input_id!r} (first on line {where})"
            if rejects.admit(line, reason):
                yield row(line, reason, rejected_raw(raw, record), seed.input_id)
            continue
        yield seed
    if rows_read == 0:
        yield row(None, "the file is empty (no rows, only blank lines or a header)", path.name)


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
        yield from _file_rows(path, file, size, source, rejects, row)
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


class InputReader(BaseModel):
    """One input file's rows in chunks, as storage's landing asks for them (`chunks(path)`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source_name: str = Field(description="Stored as `source_file` (the inbox name).")
    now: datetime
    max_input_bytes: int = Field(default=MAX_INPUT_BYTES, gt=0)
    chunk_rows: int = Field(default=CHUNK_ROWS, gt=0)

    def chunks(self, path: Path) -> Iterator[InputBatch]:
        rows = iter_inbox_rows(
            path,
            source_name=self.source_name,
            now=self.now,
            max_input_bytes=self.max_input_bytes,
        )
        return in_chunks(rows, chunk_rows=self.chunk_rows)
