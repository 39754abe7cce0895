"""What an input row may hold: integers the tables can store, ids PostgreSQL can store (issue 42,
items 8 and 9)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kimi_batch.engine import SamplingParams
from kimi_batch.inputs.reader import read_inbox_file

TOO_BIG = 18446744073709551615  # 2**64 - 1: over a signed 64-bit column


def _jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.mark.parametrize(
    ("field", "value"),
    [("seed", TOO_BIG), ("seed", -(1 << 63) - 1), ("max_tokens", 1 << 63)],
)
def test_an_integer_past_64_bits_is_quarantined(tmp_path: Path, field: str, value: int) -> None:
    path = _jsonl(
        tmp_path / "rows.jsonl",
        [
            {"id": "a", "prompt": "First?"},
            {"id": "b", "prompt": "Second?", field: value},
            {"id": "c", "prompt": "Third?", "seed": (1 << 63) - 1, "max_tokens": 1},
        ],
    )

    batch = read_inbox_file(path)

    assert [seed.input_id for seed in batch.seeds] == ["a", "c"]
    assert batch.seeds[1].params.seed == (1 << 63) - 1
    [row] = batch.quarantined
    assert (row.line, row.input_id) == (2, None)
    assert row.reason.startswith(f"{field}: must be a 64-bit integer")


def test_an_integer_past_64_bits_in_a_batch_line_is_quarantined(tmp_path: Path) -> None:
    line = {
        "custom_id": "r1",
        "url": "/v1/chat/completions",
        "body": {"messages": [{"role": "user", "content": "Hi"}], "seed": TOO_BIG},
    }
    batch = read_inbox_file(_jsonl(tmp_path / "batch.jsonl", [line]))

    assert batch.seeds == []
    assert batch.quarantined[0].reason.startswith("body.seed: must be a 64-bit integer")


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ({"id": "a\x00b", "prompt": "Hi"}, "id: must not contain U+0000"),
        (
            {
                "custom_id": "\x00",
                "url": "/v1/chat/completions",
                "body": {"messages": [{"role": "user", "content": "Hi"}]},
            },
            "custom_id: must not contain U+0000",
        ),
    ],
)
def test_an_id_holding_nul_is_quarantined(
    tmp_path: Path, row: dict[str, object], reason: str
) -> None:
    batch = read_inbox_file(_jsonl(tmp_path / "rows.jsonl", [row, {"prompt": "A\x00 prompt"}]))

    # NUL in the text itself is kept: the ledger stores it JSON-escaped.
    assert [seed.prompt for seed in batch.seeds] == ["A\x00 prompt"]
    [quarantined] = batch.quarantined
    assert quarantined.reason.startswith(reason)


_TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}},
    }
]


def test_a_row_s_tools_are_kept_beside_its_messages(tmp_path: Path) -> None:
    """Issue 45 item 2: a plain row, a batch-shaped row and a CSV cell may carry `tools`."""
    rows = [
        {"id": "plain", "messages": [{"role": "user", "content": "Weather?"}], "tools": _TOOLS},
        {
            "custom_id": "line",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": "Weather?"}], "tools": _TOOLS},
        },
        {"id": "none", "prompt": "Hi."},
        {"id": "bad", "prompt": "Hi.", "tools": [{"type": "function", "function": {}}]},
        {"id": "text", "prompt": "Hi.", "tools": json.dumps(_TOOLS)},
    ]
    batch = read_inbox_file(_jsonl(tmp_path / "tools.jsonl", rows))
    tools = {seed.input_id: seed.params.tools for seed in batch.seeds}
    assert tools == {"plain": _TOOLS, "line": _TOOLS, "none": None, "text": _TOOLS}
    [bad] = batch.quarantined
    assert bad.line == 4
    assert "tools" in bad.reason
    # The tools are part of what is asked: the same prompt with tools is another request.
    seeds = {seed.input_id: seed for seed in batch.seeds}
    params = seeds["plain"].sampling_params(SamplingParams())
    assert params.tools == _TOOLS


def test_a_prompt_or_id_of_invisible_characters_only_is_quarantined_as_empty(
    tmp_path: Path,
) -> None:
    """`str.strip` keeps a zero-width space, a byte order mark and a soft hyphen: a row of
    nothing but those was sent to the model, an id of them accepted."""
    line = {
        "custom_id": " \u200b ",
        "url": "/v1/chat/completions",
        "body": {"messages": [{"role": "user", "content": "Hi"}]},
    }
    rows = [
        {"id": "zwsp", "prompt": "\u200b"},
        {"id": "bom", "prompt": "\ufeff \u00ad"},
        {"id": "chat", "messages": [{"role": "user", "content": "\u2060"}]},
        {"id": "\u200b", "prompt": "Who?"},
        {"id": "kept", "prompt": "\u200bWhy?"},
    ]
    batch = read_inbox_file(_jsonl(tmp_path / "rows.jsonl", rows))
    assert [seed.input_id for seed in batch.seeds] == ["kept"]
    reasons = [row.reason for row in batch.quarantined]
    assert len(reasons) == 4
    assert all("must not be empty" in reason for reason in reasons), reasons
    lines = read_inbox_file(_jsonl(tmp_path / "batch.jsonl", [line]))
    assert lines.seeds == []
    assert lines.quarantined[0].reason.startswith("custom_id: must not be blank")
