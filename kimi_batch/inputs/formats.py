"""Incremental decoding of inbox files into raw rows, one format per reader, memory bounded.

Each reader yields `Item`s: the row's line, the decoded record (or why it could not be decoded)
and what to show in the quarantine's `raw` column. A bad row is an `Item` with an `error`; only
what makes the rest of a file unreadable raises (the caller turns that into one file-level row).

CSV is read strictly (a quote must close where a field ends): a line opening a quote that never
closes properly is set aside by itself and reading goes on at the line after it, so one stray
quote never swallows the rest of the file into one row. Bytes that are not UTF-8 cost their own
row too: CSV is decoded with `surrogateescape` and a row holding an escaped byte is set aside
(a strict decoder would raise out of the file's text stream and end the file there).

Parquet cannot tell a missing struct field from a null one, so a nested struct's null fields are
dropped (`_present`): rows whose nested values (`tools`) have different keys come back as written.

Memory stays bounded whatever the file holds: JSONL is read line by line and CSV record by record
from the open file, each row at most `max_row_bytes` (a longer one is skipped, not loaded),
Parquet slice by slice, and a `.json` array (which has to be parsed whole) only up to a small size.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any, NamedTuple

import polars as pl

from kimi_batch.errors import KimiBatchError

# ~250k tokens: more than a slot's context on the target; a longer row cannot be a prompt.
MAX_ROW_BYTES = 1 << 20
# A JSON array is parsed whole and its Python objects take ~8x the file size.
MAX_JSON_ARRAY_BYTES = 16 << 20
PARQUET_BATCH_ROWS = 8192
_PREVIEW_CHARS = 4000  # more than the quarantine's `raw` keeps, so the cut is marked there
_SKIP_CHUNK = 1 << 16
_TEXT_SUFFIXES = (".jsonl", ".ndjson", ".json", ".csv")
# Longest first: the UTF-32 little-endian BOM starts with the UTF-16 one.
_WIDE_BOMS = (
    (b"\xff\xfe\x00\x00", "UTF-32"),
    (b"\x00\x00\xfe\xff", "UTF-32"),
    (b"\xff\xfe", "UTF-16"),
    (b"\xfe\xff", "UTF-16"),
)
_SNIFF_BYTES = 64
# What `surrogateescape` decodes a byte that is not UTF-8 to (valid UTF-8 never decodes to these).
_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")
_DOUBLE_MAX = sys.float_info.max


def number_spelling(value: object) -> str | None:
    """How a number a request's strict JSON has no room for is spelled: `NaN`, `Infinity`,
    `-Infinity` (Python's JSON reader takes all three, and reads `1e999` as infinity), or an
    integer past a double's range (llama-server reads every JSON number as a 64-bit integer or
    a double); None for any other value."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > _DOUBLE_MAX:
        return "an integer past a double's range"
    return None


class FileRefusedError(KimiBatchError, ValueError):
    """The file is not read (further) for a reason the user can act on."""


# Whatever stops a file from being read further: the rest of the file becomes one quarantine row.
# A deeply nested `.json` array raises RecursionError, a malformed Parquet file may panic in Rust.
FILE_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    UnicodeError,
    ValueError,
    RecursionError,
    csv.Error,
    pl.exceptions.PolarsError,
    pl.exceptions.PanicException,
)


class Item(NamedTuple):
    """One raw row of an input file."""

    line: int | None
    record: Any  # the decoded row; None when `error` is set
    raw: Any  # the row as written (text), or a value shown as JSON; None: show `record`
    error: str | None  # why the row could not be decoded


def check_text_encoding(file: IO[bytes], suffix: str) -> None:
    """Refuse a text input written in UTF-16/32 (a BOM, or ASCII with every other byte NUL, as
    Windows tools write it): read as UTF-8 every line would be its own confusing error. The
    file is left at its start."""
    if suffix.lower() not in _TEXT_SUFFIXES:
        return
    head = file.read(_SNIFF_BYTES)
    file.seek(0)
    encoding = next((name for bom, name in _WIDE_BOMS if head.startswith(bom)), None)
    pairs = len(head) // 2
    if encoding is None and pairs >= 2:
        even_nul = sum(head[i] == 0 for i in range(0, 2 * pairs, 2))
        odd_nul = sum(head[i] == 0 for i in range(1, 2 * pairs, 2))
        if max(even_nul, odd_nul) >= pairs * 3 // 4 and min(even_nul, odd_nul) == 0:
            encoding = "UTF-16"
    if encoding is not None:
        raise FileRefusedError(
            f"{encoding} text; convert to UTF-8 (e.g. iconv -f {encoding} -t UTF-8)"
        )


def _preview(data: bytes) -> str:
    return data[:_PREVIEW_CHARS].decode("utf-8", "replace")


def _skip_line(file: IO[bytes]) -> None:
    """Read past the rest of an over-long line without holding it."""
    while (piece := file.readline(_SKIP_CHUNK)) and not piece.endswith(b"\n"):
        pass


def _json_reason(error: ValueError | RecursionError) -> str:
    if isinstance(error, json.JSONDecodeError):
        return f"invalid JSON: {error.msg} (column {error.colno})"
    if isinstance(error, RecursionError):
        return "invalid JSON: nested too deeply"
    # int() refuses numbers over 4300 digits (sys.int_info): keep the message, not its hint.
    return f"invalid JSON: {str(error).split(':')[0]}"


def jsonl_items(file: IO[bytes], *, max_row_bytes: int = MAX_ROW_BYTES) -> Iterator[Item]:
    """One JSON value a line, read line by line; blank lines are skipped."""
    number = 0
    # Room for a CRLF: the limit counts the line's content, whichever ending it has.
    while line := file.readline(max_row_bytes + 2):
        number += 1
        ended = line.endswith(b"\n")
        content = line.removesuffix(b"\n").removesuffix(b"\r")
        if len(content) > max_row_bytes:
            if not ended:
                _skip_line(file)
            yield Item(number, None, _preview(line), f"line is over {max_row_bytes} bytes")
            continue
        try:
            text = content.decode("utf-8-sig" if number == 1 else "utf-8").strip()
        except UnicodeDecodeError:
            yield Item(number, None, repr(line[:_PREVIEW_CHARS]), "line is not valid UTF-8")
            continue
        if not text:
            continue
        try:
            yield Item(number, json.loads(text), text, None)
        except (ValueError, RecursionError) as error:
            yield Item(number, None, text, _json_reason(error))


def json_items(
    file: IO[bytes], *, size: int, max_json_bytes: int = MAX_JSON_ARRAY_BYTES
) -> Iterator[Item]:
    """A JSON array of rows; parsed whole, so only up to `max_json_bytes`."""
    if size > max_json_bytes:
        raise FileRefusedError(
            f"a .json file is parsed whole and this one is {size} bytes, over the limit of "
            f"{max_json_bytes}: use JSONL (one row a line) for larger inputs"
        )
    records = json.loads(file.read().decode("utf-8-sig"))
    if not isinstance(records, list):
        raise ValueError(f"expected a JSON array of rows, got {type(records).__name__}")
    for number, record in enumerate(records, start=1):
        yield Item(number, record, None, None)


def _require_prompt_column(columns: Iterable[str]) -> None:
    if not {"prompt", "messages"} & set(columns):
        raise ValueError("no `prompt` or `messages` column")


class _RowTooLongError(Exception):
    pass


# Where a CSV field's state can change: its quotes, and the delimiter and line ends outside them.
_CSV_MARKS = re.compile('[",\r\n]')
_FIELD_START, _UNQUOTED, _IN_QUOTES, _QUOTE_IN_QUOTES = range(4)
_AFTER_QUOTE = {
    _FIELD_START: _IN_QUOTES,  # the quote opens a quoted field
    _UNQUOTED: _UNQUOTED,  # text: `5" wide` is a legal unquoted field
    _IN_QUOTES: _QUOTE_IN_QUOTES,  # the field closes, unless a second quote makes it `""`
    _QUOTE_IN_QUOTES: _IN_QUOTES,
}


class _Quoting:
    """Whether the text of a record read so far leaves a quoted field open, as `csv` (the excel
    dialect) reads it: only a quote that starts a field opens one, so a quote inside an unquoted
    field is text and never makes the rest of the file look quoted. Only the quotes, delimiters
    and line ends are looked at, and a piece without a quote only by its last character."""

    def __init__(self) -> None:
        self._state = _FIELD_START

    @property
    def open(self) -> bool:
        return self._state == _IN_QUOTES

    def feed(self, text: str) -> None:
        state = self._state
        if '"' not in text:
            if state != _IN_QUOTES and text:
                state = _FIELD_START if text[-1] in ",\r\n" else _UNQUOTED
            self._state = state
            return
        at = 0
        for mark in _CSV_MARKS.finditer(text):
            if mark.start() > at and state in (_FIELD_START, _QUOTE_IN_QUOTES):
                state = _UNQUOTED  # text before the mark (after a closing quote: csv's error)
            if mark.group() == '"':
                state = _AFTER_QUOTE[state]
            elif state != _IN_QUOTES:
                state = _FIELD_START
            at = mark.end()
        if at < len(text) and state in (_FIELD_START, _QUOTE_IN_QUOTES):
            state = _UNQUOTED
        self._state = state


class _BoundedLines:
    """CSV input lines with a size budget per record; counts physical lines.

    csv.reader pulls lines from here; a record that grows past the budget raises out of the
    reader (which starts afresh at the next call), and `skip_record` reads past its rest. A
    record whose first line leaves a quote open marks where its second line starts, so that a
    quote that never closes properly costs its own line only (`resync`), not the rest of the file.
    """

    def __init__(self, text: IO[str], limit: int) -> None:
        self._text = text
        self._limit = limit
        self._size = 0
        self._quoting = _Quoting()
        self._mid_line = False
        self._resume: int | None = None  # where the record's second line starts
        self._first = 0  # the physical line the record starts on
        self.lines = 0
        self.preview = ""

    def start_record(self) -> None:
        self._size = 0
        self._quoting = _Quoting()
        self._resume = None
        self._first = self.lines + 1
        self.preview = ""

    def __iter__(self) -> Iterator[str]:
        return self

    def _readline(self, size: int) -> str:
        """A line of at most `size` characters, and the LF of a CRLF that `size` cut in two
        (read alone, it would count as a line of its own and shift every later line number)."""
        line = self._text.readline(size)
        if len(line) == size and line.endswith("\r"):
            at = self._text.tell()
            if self._text.read(1) == "\n":
                return line + "\n"
            self._text.seek(at)
        return line

    def __next__(self) -> str:
        if self._size > self._limit:
            raise _RowTooLongError  # the record goes on past a line that filled its budget
        # +2: the budget counts the record's characters; the ending of its last line (LF or
        # CRLF alike) is not one of them, the line endings inside a quoted cell are.
        line = self._readline(self._limit - self._size + 2)
        if not line:
            raise StopIteration
        first = not self._size
        if first:
            self.preview = line[:_PREVIEW_CHARS]
        self._size += len(line)
        self._quoting.feed(line)
        ending = 2 if line.endswith("\r\n") else int(line.endswith(("\n", "\r")))
        self._mid_line = self._size > self._limit and not ending
        if not self._mid_line:
            self.lines += 1
            if first and self._quoting.open:
                # Rare (a cell spanning lines, or a stray quote): only then is the position asked.
                self._resume = self._text.tell()
        if self._size - ending > self._limit:
            raise _RowTooLongError
        return line

    @property
    def quote_open(self) -> bool:
        """Whether the record read so far leaves a quoted field open (`_Quoting`)."""
        return self._quoting.open

    def resync(self) -> bool:
        """After a record spanning lines failed: go back to its second line, so only its first
        line is set aside. False when the record was one line (nothing to go back to)."""
        if self._resume is None or self.lines <= self._first:
            return False
        self._text.seek(self._resume)
        self.lines = self._first
        return True

    def skip_record(self) -> bool:
        """Read to the end of a line outside a quoted field (`_Quoting`: a quote inside an
        unquoted field is text, so the rows after a long one with `5" wide` in it are read).
        When the file ends with the quote still open, the quote never closed: go back to the
        record's second line instead (`resync`) and return True."""
        while self._mid_line or self._quoting.open:
            piece = self._readline(_SKIP_CHUNK)
            if not piece:
                return self.resync()
            self._quoting.feed(piece)
            self._mid_line = not piece.endswith(("\n", "\r"))
            if not self._mid_line:
                self.lines += 1
                if self.lines == self._first and self._resume is None and self._quoting.open:
                    self._resume = self._text.tell()  # the end of an over-long first line
        return False


_UNCLOSED = (
    "a quoted field opened on this line does not close where a field ends; this line is set "
    "aside and reading goes on at the next line"
)


def _ensure_field_limit(limit: int) -> None:
    # The reader's own limit (128 KiB by default) raises mid-record; records are bounded here.
    if csv.field_size_limit() < limit:
        csv.field_size_limit(limit)


def _shown(text: str) -> str:
    """`text` with its bytes that are not UTF-8 written `\\xNN` (`raw` is stored as UTF-8)."""
    if text.isascii() or not _ESCAPED_BYTE.search(text):
        return text
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _not_utf8(header: list[str], fields: list[str]) -> str | None:
    """Why a row holding a byte that is not UTF-8 is set aside (None: the row is valid text)."""
    for index, field in enumerate(fields):
        if field.isascii() or not (found := _ESCAPED_BYTE.search(field)):
            continue
        column = _shown(header[index]) if index < len(header) else f"field {index + 1}"
        byte = ord(found.group()) - 0xDC00
        return f"row is not valid UTF-8 (byte 0x{byte:02x} in {column!r}); save the file as UTF-8"
    return None


def csv_items(file: IO[bytes], *, max_row_bytes: int = MAX_ROW_BYTES) -> Iterator[Item]:
    """Rows under a header line; a quoted cell may span lines. Sizes count characters."""
    _ensure_field_limit(max_row_bytes + 1)
    # surrogateescape: a byte that is not UTF-8 costs its row (`_not_utf8`), not the rest of the
    # file, and the rows around it are decoded exactly as a strict decoder would.
    text = io.TextIOWrapper(file, encoding="utf-8-sig", errors="surrogateescape", newline="")
    lines = _BoundedLines(text, max_row_bytes)
    # strict: a quote that closes in the middle of a field is an error, not text glued on.
    reader = csv.reader(lines, strict=True)
    try:
        header = next(reader, None) or []
    except _RowTooLongError as error:
        raise FileRefusedError(f"the header line is over {max_row_bytes} characters") from error
    _require_prompt_column(header)
    while True:
        line = lines.lines + 1
        lines.start_record()
        try:
            fields = next(reader)
        except StopIteration:
            return
        except _RowTooLongError:
            reason = f"row is over {max_row_bytes} characters"
            if lines.skip_record():
                reason += f"; {_UNCLOSED}"
            yield Item(line, None, _shown(lines.preview), reason)
            continue
        except csv.Error as error:
            reason = f"invalid CSV: {error}"
            if lines.resync() or lines.quote_open:
                reason = f"invalid CSV: {_UNCLOSED} ({error})"
            yield Item(line, None, _shown(lines.preview), reason)
            continue
        if not fields:
            continue  # a blank line, as csv.DictReader skips it
        if (reason := _not_utf8(header, fields)) is not None:
            yield Item(line, None, _shown(lines.preview), reason)
            continue
        row: dict[str, str | None] = dict.fromkeys(header)
        row.update(zip(header, fields, strict=False))
        if len(fields) > len(header):
            yield Item(line, None, [*fields], "row has more fields than the header")
            continue
        record: dict[str, str | None] = {k: v for k, v in row.items() if v not in (None, "")}
        # An empty cell means "not set", but an empty prompt in a row without messages is the
        # user's mistake and should be reported as such, not as a missing column.
        if "prompt" in row and "messages" not in record:
            record.setdefault("prompt", row["prompt"])
        yield Item(line, record, row, None)


def _present(value: Any) -> Any:
    """`value` with the null fields of its structs dropped, at any depth; list items are kept.

    A Parquet struct column has one set of fields for all its rows (pyarrow and polars merge the
    keys of every row's value), and a key a row did not write reads back as null: without this,
    each row's nested `tools` would carry the other rows' keys as nulls (`"required": null`), an
    invalid JSON Schema. Parquet cannot tell such a null from one the row wrote, so a null the
    row wrote is dropped too (a schema's `"default": null` is lost; a JSON text cell keeps it).
    A null list item is a value of its own, not a merged key, and stays.
    """
    if isinstance(value, dict):
        return {key: _present(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [_present(item) for item in value]
    return value


def parquet_items(path: Path, *, batch_rows: int = PARQUET_BATCH_ROWS) -> Iterator[Item]:
    """Rows of a Parquet file, read a slice at a time (polars reads only the row groups needed)."""
    frame = pl.scan_parquet(path)
    _require_prompt_column(frame.collect_schema().names())
    total = int(frame.select(pl.len()).collect().item())
    for offset in range(0, total, batch_rows):
        batch = frame.slice(offset, batch_rows).collect()
        for number, record in enumerate(batch.iter_rows(named=True), start=offset + 1):
            # Columns a row does not use are null there (e.g. `prompt` in a `messages` row), and
            # so are the fields of a nested struct that only other rows wrote (`_present`).
            yield Item(number, _present(record), None, None)
