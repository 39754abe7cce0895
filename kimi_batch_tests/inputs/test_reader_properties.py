"""Hostile-input properties of the inbox readers (issue 42): whatever a file holds, every row of
it is either a seed or a quarantine row with a reason, never merged into another or dropped, and
a kept row's text is the text written.

Each property writes a generated file (text in many scripts, control characters, NUL, quotes
and separators, integers past 64 bits) and reads it with `read_inbox_file`, as the landing does.
"""

from __future__ import annotations

import csv
import io
import json
import tempfile
import unicodedata
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import polars as pl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kimi_batch.inputs.formats import csv_items
from kimi_batch.inputs.prompts import InputBatch
from kimi_batch.inputs.reader import read_inbox_file

EXAMPLES = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1

# Scripts without spaces and with, right-to-left, combining marks, emoji, the separators and
# control characters a file can hold; every code point Python can encode besides.
_ODD = (
    "日本語の質問中文问题Русский вопросعربيעבריתहिन्दी한국어ไทย😀👩‍👩‍👧é\u0301"
    "\x00\x01\x07\x08\x0b\x0c\x1b\x1c\x7f\x85\u2028\u2029\u200b\ufeff\t\r\n \"',;\\{}[]"
)
TEXT = st.text(
    st.one_of(st.characters(codec="utf-8"), st.sampled_from(_ODD)), min_size=0, max_size=30
)
HUGE = st.one_of(
    st.integers(INT64_MIN, INT64_MAX),
    st.integers(-(1 << 80), 1 << 80),
    st.sampled_from([INT64_MAX, INT64_MAX + 1, INT64_MIN, INT64_MIN - 1, (1 << 64) - 1]),
)


@contextmanager
def _folder() -> Iterator[Path]:
    # hypothesis runs many examples in one test: a folder of its own for each.
    with tempfile.TemporaryDirectory() as name:
        yield Path(name)


@st.composite
def _row(draw: st.DrawFn) -> dict[str, Any]:
    """A plain row or an OpenAI batch line, each field hostile or absent."""
    row: dict[str, Any] = {}
    if draw(st.booleans()):
        row["id"] = draw(st.one_of(TEXT, HUGE))
    if draw(st.booleans()):
        row["seed"] = draw(HUGE)
    if draw(st.booleans()):
        row["max_tokens"] = draw(HUGE)
    # A lone surrogate arrives as a JSON escape (a broken escape or a mis-decoded file).
    prompt = draw(st.one_of(TEXT, TEXT.map(lambda text: text + "\udc80")))
    if draw(st.integers(0, 4)) == 0:
        custom_id = draw(TEXT)
        body = {**row, "messages": [{"role": "user", "content": prompt}]}
        body.pop("id", None)
        return {"custom_id": custom_id, "url": "/v1/chat/completions", "body": body}
    if draw(st.integers(0, 4)) == 0:
        return {**row, "messages": [{"role": "user", "content": prompt}]}
    return {**row, "prompt": prompt}


def _written_prompt(row: Any) -> Any:
    """The prompt a row was written with."""
    if isinstance(row, dict) and "body" in row:
        return row["body"]["messages"][0]["content"]
    if isinstance(row, dict) and "messages" in row:
        return row["messages"][0]["content"]
    return row.get("prompt") if isinstance(row, dict) else None


def _fits(value: Any) -> bool:
    return not isinstance(value, int) or INT64_MIN <= value <= INT64_MAX


def _shows_something(text: str) -> bool:
    """Not blank: a character that is neither whitespace nor an invisible format one (Cf)."""
    return any(not ch.isspace() and unicodedata.category(ch) != "Cf" for ch in text)


def _plainly_valid(row: dict[str, Any]) -> bool:
    """Whether a row must be kept, ids apart (a repeated id is set aside)."""
    fields = row.get("body", row)
    prompt = _written_prompt(row)
    tokens = fields.get("max_tokens")
    return (
        isinstance(prompt, str)
        and _shows_something(prompt)
        and "\udc80" not in prompt
        and all(_fits(fields.get(name)) for name in ("seed", "max_tokens"))
        and (tokens is None or tokens > 0)
    )


def _check(batch: InputBatch, written: dict[int, Any]) -> None:
    """Every written row (by line) is a seed or a quarantine row with a reason, once."""
    kept = {seed.line or 0: seed for seed in batch.seeds}  # a row always has its line
    set_aside = {row.line or 0: row for row in batch.quarantined}
    assert len(kept) == len(batch.seeds)  # no line twice
    assert len(set_aside) == len(batch.quarantined)
    assert set(kept).isdisjoint(set_aside)
    assert set(kept) | set(set_aside) == set(written)  # none dropped, none made up
    for line, seed in kept.items():
        assert seed.prompt == _written_prompt(written[line])  # the text as written, whole
    for row in batch.quarantined:
        assert row.reason.strip()


def _check_kept(batch: InputBatch, written: dict[int, dict[str, Any]]) -> None:
    """A row that is plainly valid and whose id is its own is kept (not thrown away); one with
    a blank prompt or an integer past 64 bits is not."""
    ids: dict[str, int] = {}
    for row in written.values():
        raw = row.get("custom_id", row.get("id"))
        key = str(raw).strip() if raw is not None else None
        if key is not None:
            ids[key] = ids.get(key, 0) + 1
    kept = {seed.line for seed in batch.seeds}
    for line, row in written.items():
        raw = row.get("custom_id", row.get("id"))
        if isinstance(raw, int):
            raw = str(raw)
        own_id = raw is None or (
            isinstance(raw, str)
            and _shows_something(raw)
            and "\x00" not in raw
            and ids[raw.strip()] == 1
            and (raw == raw.strip() or "custom_id" not in row)
        )
        if _plainly_valid(row) and own_id and raw is not None:
            assert line in kept, (line, row)
        if not _plainly_valid(row):
            assert line not in kept, (line, row)


LINE = st.one_of(
    _row(),
    TEXT.map(lambda text: text.replace("\n", "")),  # not JSON, or JSON but not a row
    st.integers(1, 3000),  # a row nested this deep
)


def _json(value: object) -> str:
    """`value` as JSON, in UTF-8 where it can be (a lone surrogate only as an escape)."""
    text = json.dumps(value, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(value)
    return text


def _line_text(item: dict[str, Any] | str | int) -> str:
    if isinstance(item, dict):
        return _json(item)
    if isinstance(item, int):
        return '{"prompt": "deep", "meta": ' + "[" * item + "]" * item + "}"
    return item


@EXAMPLES
@given(items=st.lists(LINE, max_size=12))
def test_jsonl_rows_are_kept_or_quarantined(items: list[dict[str, Any] | str | int]) -> None:
    lines = [_line_text(item) for item in items]
    with _folder() as folder:
        path = folder / "rows.jsonl"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        batch = read_inbox_file(path)

    written: dict[int, Any] = {}
    for number, (item, text) in enumerate(zip(items, lines, strict=True), start=1):
        if (text.removeprefix("\ufeff") if number == 1 else text).strip():  # blank: skipped
            written[number] = {"prompt": "deep"} if isinstance(item, int) else item
    if not written:
        assert [row.line for row in batch.quarantined] == [None]  # the file is empty
        return
    _check(batch, written)
    _check_kept(batch, {n: row for n, row in written.items() if n in _rows_of(items)})


def _rows_of(items: Sequence[object]) -> set[int]:
    return {n for n, item in enumerate(items, start=1) if isinstance(item, dict)}


@EXAMPLES
@given(rows=st.lists(_row(), min_size=1, max_size=12))
def test_json_array_rows_are_kept_or_quarantined(rows: list[dict[str, Any]]) -> None:
    with _folder() as folder:
        path = folder / "rows.json"
        path.write_text(_json(rows), encoding="utf-8")
        batch = read_inbox_file(path)

    written = dict(enumerate(rows, start=1))
    _check(batch, written)
    _check_kept(batch, written)


@EXAMPLES
@given(
    rows=st.lists(st.tuples(TEXT, TEXT), min_size=1, max_size=12),
    seeds=st.lists(st.one_of(st.none(), HUGE), min_size=12, max_size=12),
)
def test_csv_rows_written_by_a_csv_writer_are_kept_whole(
    rows: list[tuple[str, str]], seeds: list[int | None]
) -> None:
    """Whatever the cells hold (quotes, separators, newlines of every kind), a row a CSV writer
    wrote is one row: kept with its text, or quarantined (an empty prompt, a repeated id, a
    seed past 64 bits)."""
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer)
    writer.writerow(["id", "prompt", "seed"])
    starts: dict[int, tuple[str, str, int | None]] = {}
    for row, seed in zip(rows, seeds, strict=False):
        starts[buffer.getvalue().count("\n") + 1 + _bare_cr_lines(buffer.getvalue())] = (*row, seed)
        writer.writerow([*row, "" if seed is None else str(seed)])
    with _folder() as folder:
        path = folder / "rows.csv"
        path.write_text(buffer.getvalue(), encoding="utf-8", newline="")
        batch = read_inbox_file(path)

    assert len(batch.seeds) + len(batch.quarantined) == len(rows)
    by_id = {seed.input_id: seed for seed in batch.seeds}
    for kept in batch.seeds:
        written_id, prompt, seed = starts[kept.line or 0]
        assert kept.prompt == prompt
        assert kept.params.seed == seed  # so never one past 64 bits
        assert written_id.strip() in ("", kept.input_id)
    for (written_id, prompt), kept, seed in zip(rows, _kept_flags(rows), seeds, strict=False):
        if kept and _fits(seed):
            assert by_id[written_id.strip()].prompt == prompt
    assert all(row.reason.strip() for row in batch.quarantined)


def _bare_cr_lines(text: str) -> int:
    """Physical lines the reader counts that end in a lone \\r (its newline="" mode)."""
    return text.replace("\r\n", "").count("\r")


def _kept_flags(rows: Sequence[tuple[str, str]]) -> list[bool]:
    """Which rows must be kept: a prompt that is not blank and an id that is its own."""
    ids = [row_id.strip() for row_id, _ in rows]
    return [
        _shows_something(prompt)
        and _shows_something(row_id)
        and "\x00" not in row_id
        and ids.count(row_id) == 1
        for row_id, (_, prompt) in zip(ids, rows, strict=True)
    ]


@EXAMPLES
@given(
    rows=st.lists(st.tuples(st.integers(0, 10**6), TEXT), min_size=1, max_size=20),
    bad=st.lists(st.tuples(st.integers(0, 20), TEXT), min_size=1, max_size=3),
)
def test_csv_lines_with_a_quote_that_never_closes_cost_their_own_line(
    rows: list[tuple[int, str]], bad: list[tuple[int, str]]
) -> None:
    """A line opening a quoted cell it never closes, among rows that hold no quote: it is set
    aside with its reason, every other row is read as written."""
    plain = [(n, _unquoted(text)) for n, text in rows]
    lines = [f"{n},{text}" for n, text in plain]
    strays: set[str] = set()
    for at, text in sorted(bad, reverse=True):
        stray = f'stray-{len(strays)},"{_unquoted(text)}'
        strays.add(stray)
        lines.insert(min(at, len(lines)), stray)
    with _folder() as folder:
        path = folder / "rows.csv"
        path.write_text("id,prompt\n" + "\n".join(lines) + "\n", encoding="utf-8", newline="")
        batch = read_inbox_file(path)

    by_line = {n: line for n, line in enumerate(lines, start=2)}
    _check_lines(batch, by_line)
    for row in batch.quarantined:
        if by_line[row.line or 0] in strays:
            assert "does not close where a field ends" in row.reason


@EXAMPLES
@given(
    rows=st.lists(
        st.tuples(TEXT, st.one_of(st.none(), st.integers(1, 10))), min_size=1, max_size=12
    ),
    limit=st.integers(10, 40),
)
def test_csv_rows_over_the_size_limit_cost_their_own_line_only(
    rows: list[tuple[str, int | None]], limit: int
) -> None:
    """Rows a CSV writer wrote, and rows with a quote inside an unquoted field (`5" wide`, which
    csv reads as text), some longer than the limit: each row is one item on its own first line,
    set aside if it is over the limit and read as written if not."""
    lines: list[tuple[str, str]] = []  # (the row as written, its prompt)
    for n, (text, quote_at) in enumerate(rows):
        if quote_at is None:
            buffer = io.StringIO(newline="")
            # Its default ending, CRLF, makes the writer quote a cell holding either character.
            csv.writer(buffer).writerow([str(n), text])
            lines.append((buffer.getvalue().removesuffix("\r\n"), text))
        else:  # the quote is never a field's first character
            plain = _unquoted(text)
            prompt = f'{plain[:quote_at]}"{plain[quote_at:]}'
            lines.append((f"{n},{prompt}", prompt))
    data = "id,prompt\n" + "".join(f"{line}\n" for line, _ in lines)

    items = list(csv_items(io.BytesIO(data.encode()), max_row_bytes=limit))

    starts, at = [], 2
    for line, _ in lines:
        starts.append(at)
        at += 1 + line.replace("\r\n", "\n").count("\n") + _bare_cr_lines(line)
    assert [item.line for item in items] == starts
    for n, (item, (line, prompt)) in enumerate(zip(items, lines, strict=True)):
        if len(line) > limit:
            assert item.error is not None
            assert item.error.startswith(f"row is over {limit} characters")
        else:
            assert item.error is None
            assert item.record == {"id": str(n), "prompt": prompt}


def _unquoted(text: str) -> str:
    """Cell text a CSV writer would leave unquoted: no quote, separator or newline."""
    return "".join(c for c in text if c not in '",\r\n') or "x"


def _check_lines(batch: InputBatch, by_line: dict[int, str]) -> None:
    lines = sorted(
        [seed.line or 0 for seed in batch.seeds] + [q.line or 0 for q in batch.quarantined]
    )
    assert lines == sorted(by_line)
    for seed in batch.seeds:
        assert by_line[seed.line or 0] == f"{seed.input_id},{seed.prompt}"
    assert all(row.reason.strip() for row in batch.quarantined)


@EXAMPLES
@given(
    rows=st.lists(
        st.tuples(st.one_of(st.none(), TEXT), st.one_of(st.none(), TEXT), st.integers(0, 1 << 64)),
        min_size=1,
        max_size=12,
    ),
    unsigned=st.booleans(),
)
def test_parquet_rows_are_kept_or_quarantined(
    rows: list[tuple[str | None, str | None, int]], unsigned: bool
) -> None:
    """Text of every kind, and a seed column of unsigned 64-bit integers (past a signed one)."""
    seeds = [r[2] % (1 << 64) if unsigned else r[2] % (1 << 63) for r in rows]
    frame = pl.DataFrame(
        {"id": [r[0] for r in rows], "prompt": [r[1] for r in rows], "seed": seeds},
        schema={"id": pl.String, "prompt": pl.String, "seed": pl.UInt64 if unsigned else pl.Int64},
    )
    with _folder() as folder:
        path = folder / "rows.parquet"
        frame.write_parquet(path)
        batch = read_inbox_file(path)

    written = {
        n: {k: v for k, v in (("id", i), ("prompt", p), ("seed", s)) if v is not None}
        for n, ((i, p, _), s) in enumerate(zip(rows, seeds, strict=True), start=1)
    }
    _check(batch, written)
    _check_kept(batch, written)
