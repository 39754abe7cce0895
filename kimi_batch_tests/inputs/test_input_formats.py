"""The CSV decoder: a quote that never closes properly costs its own line, not the rest of the
file (issue 42, item 1); so does a byte that is not UTF-8, and a row's line ending never counts
against its size (LF and CRLF alike)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from kimi_batch.inputs.formats import MAX_ROW_BYTES, csv_items
from kimi_batch.inputs.reader import read_inbox_file


def _numbered_csv(path: Path, rows: int, bad: dict[int, str]) -> Path:
    """`rows` rows `n,Question number n?` under a header; `bad` replaces rows by number."""
    lines = ["id,prompt"] + [bad.get(n, f"{n},Question number {n}?") for n in range(1, rows + 1)]
    path.write_text("\n".join(lines) + "\n", newline="")
    return path


def test_an_unterminated_quote_sets_aside_its_line_only(tmp_path: Path) -> None:
    path = _numbered_csv(tmp_path / "rows.csv", 2000, {500: '500,"Question with a stray quote'})

    batch = read_inbox_file(path)

    assert len(batch.seeds) == 1999
    assert [seed.input_id for seed in batch.seeds] == [str(n) for n in range(1, 2001) if n != 500]
    assert all(seed.prompt == f"Question number {seed.input_id}?" for seed in batch.seeds)
    assert (
        batch.seeds[499].line == 502
    )  # row 501, the line after the bad one is read as its own row
    [row] = batch.quarantined
    assert row.line == 501
    assert row.reason.startswith("invalid CSV: a quoted field opened on this line")
    assert row.raw == '500,"Question with a stray quote\n'


def test_a_stray_quote_closed_by_a_later_row_sets_aside_both_bad_lines(tmp_path: Path) -> None:
    """The stray quote is closed by another line's quote, mid-field: strict csv calls that an
    error, and the rows in between are read again as rows."""
    path = _numbered_csv(
        tmp_path / "rows.csv", 50, {10: '10,"Stray quote', 40: '40,"A quoted" word then more'}
    )

    batch = read_inbox_file(path)

    assert [seed.input_id for seed in batch.seeds] == [
        str(n) for n in range(1, 51) if n not in (10, 40)
    ]
    reasons = {row.line or 0: row.reason for row in batch.quarantined}
    assert sorted(reasons) == [11, 41]
    assert "does not close where a field ends" in reasons[11]
    assert reasons[41] == "invalid CSV: ',' expected after '\"'"


def test_quoted_cells_over_lines_still_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    path.write_text('id,prompt\na,"Line one\nline ""two"", still a\n"\nb,Plain\n', newline="")

    batch = read_inbox_file(path)

    assert [(s.input_id, s.prompt, s.line) for s in batch.seeds] == [
        ("a", 'Line one\nline "two", still a\n', 2),
        ("b", "Plain", 5),
    ]
    assert batch.quarantined == []


def test_an_unterminated_quote_past_the_row_limit_sets_aside_its_line_only(
    tmp_path: Path,
) -> None:
    """The open quote swallows more than a row's budget before the file ends."""
    rows = MAX_ROW_BYTES // 20 + 100
    path = _numbered_csv(tmp_path / "big.csv", rows, {3: '3,"Never closed'})

    batch = read_inbox_file(path)

    assert len(batch.seeds) == rows - 1
    [row] = batch.quarantined
    assert row.line == 4
    assert row.reason.startswith(f"row is over {MAX_ROW_BYTES} characters; a quoted field")


def test_an_over_long_line_with_a_stray_quote_sets_aside_its_line_only(tmp_path: Path) -> None:
    long_line = '2,"' + "x" * (MAX_ROW_BYTES + 10)
    path = _numbered_csv(tmp_path / "rows.csv", 30, {2: long_line})

    batch = read_inbox_file(path)

    assert [seed.input_id for seed in batch.seeds] == [str(n) for n in range(1, 31) if n != 2]
    [row] = batch.quarantined
    assert row.line == 3
    assert row.reason.startswith(f"row is over {MAX_ROW_BYTES} characters; a quoted field")


def test_a_byte_that_is_not_utf8_sets_aside_its_row_only(tmp_path: Path) -> None:
    """One cp1252 byte in a UTF-8 file used to end the file there (229 of 499 good rows)."""
    lines = [b"id,prompt"] + [f"{n},Question {n} na\u00efve?".encode() for n in range(1, 501)]
    lines[300] = b"300,caf\xe9"
    path = tmp_path / "rows.csv"
    path.write_bytes(b"\n".join(lines) + b"\n")

    batch = read_inbox_file(path)

    assert [seed.input_id for seed in batch.seeds] == [str(n) for n in range(1, 501) if n != 300]
    assert all(seed.prompt == f"Question {seed.input_id} na\u00efve?" for seed in batch.seeds)
    [row] = batch.quarantined
    assert row.line == 301
    assert row.reason == ("row is not valid UTF-8 (byte 0xe9 in 'prompt'); save the file as UTF-8")
    assert row.raw == "300,caf\\xe9\n"  # the byte shown, as `raw` is stored as UTF-8


def test_bytes_that_are_not_utf8_in_a_malformed_row_keep_raw_storable(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    path.write_bytes(b'id,prompt\n1,"caf\xe9 never closed\n2,fine\n3,too,many\xff\n')

    batch = read_inbox_file(path)

    assert [seed.prompt for seed in batch.seeds] == ["fine"]
    reasons = {row.line: (row.reason, row.raw) for row in batch.quarantined}
    assert reasons[2][0].startswith("invalid CSV: a quoted field opened on this line")
    assert reasons[2][1] == '1,"caf\\xe9 never closed\n'
    assert (
        reasons[4][0] == "row is not valid UTF-8 (byte 0xff in 'field 3'); save the file as UTF-8"
    )
    for row in batch.quarantined:
        row.raw.encode("utf-8")


@pytest.mark.parametrize("ending", ["\n", "\r\n"])
def test_a_row_s_line_ending_does_not_count_against_its_size(ending: str) -> None:
    """A row of exactly the limit is read whatever its ending; one over it costs its own line."""
    limit = 16
    rows = ["id,prompt", "1," + "a" * (limit - 2), "2," + "b" * (limit - 1), "3,Last"]
    data = ending.join(rows) + ending

    items = list(csv_items(io.BytesIO(data.encode()), max_row_bytes=limit))

    assert [(item.line, item.error) for item in items] == [
        (2, None),
        (3, f"row is over {limit} characters"),
        (4, None),
    ]
    assert items[0].record == {"id": "1", "prompt": "a" * (limit - 2)}
    assert items[2].record == {"id": "3", "prompt": "Last"}


def test_an_over_long_row_with_a_quote_inside_a_field_costs_only_its_own_line() -> None:
    """`5" wide` is a legal unquoted field (its quote is text): skipping the over-long row it is
    in ends at that row's line end, not at the next line that holds a quote (the rows between
    were read by neither, lost)."""
    data = 'id,prompt\n1,a box 5" wide and 6 feet long\n2,b\n3,c 6" x\n4,d\n'

    items = list(csv_items(io.BytesIO(data.encode()), max_row_bytes=20))

    assert [(item.line, item.record, item.error) for item in items] == [
        (2, None, "row is over 20 characters"),
        (3, {"id": "2", "prompt": "b"}, None),
        (4, {"id": "3", "prompt": 'c 6" x'}, None),
        (5, {"id": "4", "prompt": "d"}, None),
    ]
