"""Inbox files of every format, and every kind of bad row, into seeds and quarantine rows."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kimi_batch.engine import INSTRUCTIONS_OPEN
from kimi_batch.engine.generation import SamplingParams
from kimi_batch.inputs.formats import (
    MAX_JSON_ARRAY_BYTES,
    MAX_ROW_BYTES,
    jsonl_items,
    parquet_items,
)
from kimi_batch.inputs.prompts import InputBatch, ParamOverrides, SeedPrompt
from kimi_batch.inputs.reader import in_chunks, iter_inbox_rows, read_inbox_file
from kimi_batch.pipeline import RAW_LIMIT, QuarantineRow, quarantine_overlong
from kimi_batch.settings import samples_dir

NOW = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


def _jsonl(path: Path, rows: Sequence[object]) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def _reasons(batch: InputBatch) -> dict[int | None, str]:
    return {row.line: row.reason for row in batch.quarantined}


def _tool(description: str = "Weather.", parameters: object = None) -> dict[str, object]:
    function: dict[str, object] = {"name": "get_weather", "description": description}
    if parameters is not None:
        function["parameters"] = parameters
    return {"type": "function", "function": function}


def test_jsonl_plain_rows_become_single_user_messages(tmp_path: Path) -> None:
    path = _jsonl(
        tmp_path / "seeds.jsonl",
        [{"id": "a", "prompt": "Why is the sky blue?"}, {"id": 7, "prompt": "What is 2+2?"}],
    )

    batch = read_inbox_file(path, now=NOW)

    assert batch.quarantined == []
    assert [seed.input_id for seed in batch.seeds] == ["a", "7"]
    first = batch.seeds[0]
    assert [(m.role, m.content) for m in first.messages] == [("user", "Why is the sky blue?")]
    assert first.prompt == "Why is the sky blue?"
    assert (first.source_file, first.line) == ("seeds.jsonl", 1)
    assert batch.seeds[1].line == 2


def test_system_text_is_folded_into_the_first_user_message(tmp_path: Path) -> None:
    conversation = [
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "What is rain?"},
        {"role": "assistant", "content": "De l'eau."},
        {"role": "user", "content": "And snow?"},
    ]
    path = _jsonl(
        tmp_path / "chat.jsonl",
        [
            {"id": "m", "messages": conversation},
            {"id": "s", "system": "Be brief.", "prompt": "Define entropy."},
            {
                "id": "d",
                "messages": [
                    {"role": "developer", "content": "Use metric units."},
                    {"role": "user", "content": "How far is the moon?"},
                ],
            },
        ],
    )

    seeds = {seed.input_id: seed for seed in read_inbox_file(path).seeds}

    chat = seeds["m"]
    assert all(m.role != "system" for seed in seeds.values() for m in seed.messages)
    assert [m.role for m in chat.messages] == ["user", "assistant", "user"]
    assert chat.messages[0].content.startswith(INSTRUCTIONS_OPEN)
    assert "Answer in French." in chat.messages[0].content
    assert chat.messages[0].content.endswith("What is rain?")
    assert chat.messages[2].content == "And snow?"
    assert (chat.prompt, chat.instructions) == ("And snow?", "Answer in French.")
    assert seeds["s"].messages[0].content.endswith("\n\nDefine entropy.")
    assert "Be brief." in seeds["s"].messages[0].content
    assert seeds["s"].prompt == "Define entropy."
    assert seeds["d"].instructions == "Use metric units."


def test_rows_without_id_get_a_stable_content_hash(tmp_path: Path) -> None:
    rows = [{"prompt": "Name a prime number."}, {"prompt": "Name an even number."}]
    first = read_inbox_file(_jsonl(tmp_path / "a.jsonl", rows)).seeds
    again = read_inbox_file(_jsonl(tmp_path / "b.jsonl", rows)).seeds
    (tmp_path / "c.csv").write_text("prompt\nName a prime number.\n")
    from_csv = read_inbox_file(tmp_path / "c.csv").seeds

    assert [s.input_id for s in first] == [s.input_id for s in again]
    assert first[0].input_id != first[1].input_id
    assert first[0].input_id.startswith("h-")
    assert from_csv[0].input_id == first[0].input_id


def test_openai_batch_lines(tmp_path: Path) -> None:
    def line(custom_id: str, **body: object) -> dict[str, object]:
        return {
            "custom_id": custom_id,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": body,
        }

    user = [{"role": "user", "content": "What is DNA?"}]
    path = _jsonl(
        tmp_path / "batch.jsonl",
        [
            line("r1", model="gpt-4o", messages=user, max_tokens=64, temperature=0.2, seed=3),
            line("r2", messages=user, max_tokens=64, max_completion_tokens=99),
            line(
                "r3",
                messages=[
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "Hi"},
                            {"type": "text", "text": "there"},
                        ],
                    }
                ],
            ),
            {"id": "plain", "prompt": "Mixed files work too."},
            {"custom_id": "r4", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}},
            {
                "custom_id": "r5",
                "method": "GET",
                "url": "/v1/chat/completions",
                "body": {"messages": user},
            },
        ],
    )

    batch = read_inbox_file(path)

    seeds = {seed.input_id: seed for seed in batch.seeds}
    assert list(seeds) == ["r1", "r2", "r3", "plain"]
    assert seeds["r1"].params == ParamOverrides(max_tokens=64, temperature=0.2, seed=3)
    assert seeds["r1"].messages[0].content == "What is DNA?"
    assert seeds["r2"].params.max_tokens == 99  # max_completion_tokens is the newer name
    assert seeds["r3"].prompt == "Hi\nthere"
    reasons = _reasons(batch)
    assert set(reasons) == {5, 6}
    assert reasons[5].startswith("url: ")
    assert reasons[6].startswith("method: ")


def test_json_array_file(tmp_path: Path) -> None:
    path = tmp_path / "rows.json"
    path.write_text(json.dumps([{"id": "x", "prompt": "Hello?"}, {"id": "y", "prompt": ""}]))

    batch = read_inbox_file(path)

    assert [seed.input_id for seed in batch.seeds] == ["x"]
    assert _reasons(batch) == {2: "prompt: must not be empty"}


def test_parquet_file_with_prompt_and_messages_rows(tmp_path: Path) -> None:
    path = tmp_path / "rows.parquet"
    pl.DataFrame(
        {
            "id": [1, 2, 3],
            "prompt": ["What is a noun?", None, None],
            "messages": [None, [{"role": "user", "content": "What is a verb?"}], None],
            "temperature": [0.1, None, None],
            "topic": ["grammar", "grammar", "grammar"],  # extra columns are ignored
        }
    ).write_parquet(path)

    batch = read_inbox_file(path)

    assert [seed.input_id for seed in batch.seeds] == ["1", "2"]
    assert batch.seeds[0].params.temperature == 0.1
    assert batch.seeds[1].prompt == "What is a verb?"
    assert _reasons(batch) == {3: "either prompt or messages is required"}


def test_csv_file_line_numbers_and_cells(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    path.write_text(
        "id,prompt,max_tokens,messages\n"
        'a,"A prompt\nover two lines",32,\n'
        "b,Second prompt,,\n"
        "c,,,\n"
        "d,Bad tokens,abc,\n"
        'e,,,"[{""role"": ""user"", ""content"": ""From JSON""}]"\n'
        "f,Too,many,fields,here\n",
        newline="",
    )

    batch = read_inbox_file(path)

    seeds = {seed.input_id: seed for seed in batch.seeds}
    assert list(seeds) == ["a", "b", "e"]  # "e" uses messages; its empty prompt cell is unset
    assert seeds["e"].prompt == "From JSON"
    assert seeds["a"].line == 2
    assert seeds["a"].params.max_tokens == 32
    assert seeds["b"].line == 4  # the quoted field of "a" spans lines 2-3
    assert seeds["b"].params.max_tokens is None
    reasons = _reasons(batch)
    assert reasons[5] == "prompt: must not be empty"
    assert reasons[6].startswith("max_tokens: ")
    assert reasons[8] == "row has more fields than the header"


def test_csv_messages_column_holds_json(tmp_path: Path) -> None:
    path = tmp_path / "chat.csv"
    path.write_text('id,messages\ne,"[{""role"": ""user"", ""content"": ""From JSON""}]"\nf,nope\n')

    batch = read_inbox_file(path)

    assert [seed.prompt for seed in batch.seeds] == ["From JSON"]
    assert _reasons(batch)[3].startswith("messages: not a JSON list")


def test_malformed_jsonl_mix_quarantines_each_bad_line(tmp_path: Path) -> None:
    long_line = json.dumps({"id": "long", "prompt": 5, "pad": "x" * 5000})
    path = _jsonl(
        tmp_path / "mixed.jsonl",
        [
            {"id": "ok-1", "prompt": "A good row."},  # 1
            '{"id": "broken", "prompt": ',  # 2: bad JSON
            {"id": "num", "prompt": 42},  # 3: wrong type
            {"id": "empty", "prompt": "   "},  # 4: empty prompt
            "",  # 5: blank lines are skipped
            {"id": "ok-1", "prompt": "Same id again."},  # 6: duplicate id
            {"id": "t", "prompt": "x", "max_tokens": 0, "temperature": "hot"},  # 7
            "[1, 2, 3]",  # 8: not an object
            {"id": "both", "prompt": "p", "messages": [{"role": "user", "content": "q"}]},  # 9
            {
                "id": "last",
                "messages": [
                    {"role": "user", "content": "q"},
                    {"role": "assistant", "content": "a"},
                ],
            },  # 10
            {"id": True, "prompt": "bool id"},  # 11
            {"id": "flag", "prompt": "x", "max_tokens": True},  # 12
            long_line,  # 13
            {"id": "ok-2", "prompt": "Another good row."},  # 14
        ],
    )

    batch = read_inbox_file(path, now=NOW)

    assert [seed.input_id for seed in batch.seeds] == ["ok-1", "ok-2"]
    assert batch.seeds[1].line == 14
    reasons = _reasons(batch)
    assert sorted(line for line in reasons if line is not None) == [
        2,
        3,
        4,
        6,
        7,
        8,
        9,
        10,
        11,
        12,
        13,
    ]
    assert reasons[2].startswith("invalid JSON")
    assert reasons[3] == "prompt: Input should be a valid string"
    assert reasons[4] == "prompt: must not be empty"
    assert reasons[6] == "duplicate input id 'ok-1' (first on line 1)"
    assert reasons[7].startswith("max_tokens: Input should be greater than 0; temperature: ")
    assert reasons[8] == "row must be a JSON object, got list"
    assert reasons[9] == "give either prompt or messages, not both"
    assert reasons[10] == "messages: the last message must be from the user"
    assert reasons[11] == "id: must be a string or an integer"
    assert reasons[12] == "max_tokens: must be a number, not a boolean"
    by_line = {row.line: row for row in batch.quarantined}
    assert len(by_line[13].raw) == RAW_LIMIT
    assert by_line[13].raw.endswith("…")
    assert by_line[6].input_id == "ok-1"
    assert by_line[3].raw == json.dumps({"id": "num", "prompt": 42})
    assert all(
        row.stage == "input" and row.source_file == "mixed.jsonl" for row in batch.quarantined
    )
    assert all(row.created_at == NOW for row in batch.quarantined)


def test_invalid_utf8_line_is_quarantined_alone(tmp_path: Path) -> None:
    path = tmp_path / "bytes.jsonl"
    path.write_bytes(b'{"id": "a", "prompt": "fine"}\n{"id": "b", "prompt": "\xff"}\n')

    batch = read_inbox_file(path)

    assert [seed.input_id for seed in batch.seeds] == ["a"]
    assert _reasons(batch) == {2: "line is not valid UTF-8"}


@pytest.mark.parametrize(
    ("name", "content", "reason_start"),
    [
        ("garbage.parquet", b"this is not parquet", "cannot read file: "),
        (
            "object.json",
            b'{"prompt": "not a list"}',
            "cannot read file: ValueError: expected a JSON array",
        ),
        ("truncated.json", b'[{"prompt": "x"', "cannot read file: JSONDecodeError"),
        ("noprompt.csv", b"id,question\n1,What?\n", "cannot read file: ValueError: no `prompt`"),
        ("notes.txt", b"prompt: hello", "unsupported file extension '.txt'"),
    ],
)
def test_unreadable_file_is_one_quarantine_row(
    tmp_path: Path, name: str, content: bytes, reason_start: str
) -> None:
    path = tmp_path / name
    path.write_bytes(content)

    batch = read_inbox_file(path)

    assert batch.seeds == []
    assert len(batch.quarantined) == 1
    row = batch.quarantined[0]
    assert row.reason.startswith(reason_start), row.reason
    assert (row.line, row.source_file, row.stage) == (None, name, "input")


def test_missing_file_does_not_raise(tmp_path: Path) -> None:
    batch = read_inbox_file(tmp_path / "gone.jsonl", source_name="gone")

    assert batch.seeds == []
    assert batch.quarantined[0].reason.startswith("cannot read file: FileNotFoundError")
    assert batch.quarantined[0].source_file == "gone"


def test_shipped_samples_are_valid() -> None:
    for name, count in [("seeds_general.jsonl", 6), ("openai_batch_example.jsonl", 3)]:
        batch = read_inbox_file(samples_dir() / name)
        assert batch.quarantined == [], name
        assert len(batch.seeds) == count, name


def _seed(input_id: str, line: int) -> SeedPrompt:
    return SeedPrompt.model_validate(
        {
            "input_id": input_id,
            "messages": [{"role": "user", "content": f"prompt {input_id}"}],
            "prompt": f"prompt {input_id}",
            "source_file": "f.jsonl",
            "line": line,
        }
    )


def test_quarantine_overlong_uses_server_token_counts() -> None:
    seeds = [_seed("short", 1), _seed("exact", 2), _seed("long", 3)]

    batch = quarantine_overlong(seeds, {"short": 10, "exact": 100, "long": 101}, 100, now=NOW)

    assert [seed.input_id for seed in batch.seeds] == ["short", "exact"]
    (row,) = batch.quarantined
    assert (row.input_id, row.line, row.source_file) == ("long", 3, "f.jsonl")
    assert row.reason == "prompt is 101 tokens, over the limit of 100"
    assert "prompt long" in row.raw
    with pytest.raises(ValueError, match="no token count"):
        quarantine_overlong(seeds, {"short": 1}, 100)


def test_seed_rejects_system_messages() -> None:
    with pytest.raises(ValueError, match="system messages are not allowed"):
        SeedPrompt.model_validate(
            {
                "input_id": "x",
                "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
                "prompt": "u",
                "source_file": "f",
                "line": 1,
            }
        )


def test_param_overrides_apply_only_what_is_set() -> None:
    base = SamplingParams(max_tokens=256, temperature=0.7, top_p=0.9, n_probs=2)

    merged = ParamOverrides(temperature=0.0, seed=5).apply(base)

    assert merged == SamplingParams(max_tokens=256, temperature=0.0, top_p=0.9, seed=5, n_probs=2)


# ---- bad input never stops anything ------------------------------------------------------------


def test_parser_limits_are_one_quarantined_row_each(tmp_path: Path) -> None:
    """Deep nesting (RecursionError) and a 5000-digit number (ValueError) used to end the file."""
    path = _jsonl(
        tmp_path / "limits.jsonl",
        [
            {"id": "a", "prompt": "First."},
            "[" * 100_000 + "]" * 100_000,
            {"id": "b", "prompt": "Second."},
            '{"id": "n", "prompt": "x", "seed": ' + "9" * 5000 + "}",
            '{"id": "deep", "prompt": "x", "meta": ' + "[" * 5000 + "]" * 5000 + "}",
            "x" * (MAX_ROW_BYTES + 10),
            {"id": "c", "prompt": "Third."},
        ],
    )

    batch = read_inbox_file(path)

    assert [seed.input_id for seed in batch.seeds] == ["a", "b", "c"]
    assert [seed.line for seed in batch.seeds] == [1, 3, 7]
    reasons = _reasons(batch)
    assert reasons == {
        2: "invalid JSON: nested too deeply",
        4: "invalid JSON: Exceeds the limit (4300 digits) for integer string conversion",
        5: "invalid JSON: nested too deeply",
        6: f"line is over {MAX_ROW_BYTES} bytes",
    }
    by_line = {row.line: row for row in batch.quarantined}
    assert by_line[6].raw == "x" * (RAW_LIMIT - 1) + "…"


def test_deeply_nested_json_array_is_one_file_row(tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_text('[{"id": "a", "prompt": "x"}, ' + "[" * 100_000 + "]" * 100_000 + "]")

    batch = read_inbox_file(path)

    assert batch.seeds == []
    (row,) = batch.quarantined
    assert row.line is None
    assert row.reason.startswith("cannot read file: RecursionError"), row.reason


def test_csv_long_cells_are_judged_per_row(tmp_path: Path) -> None:
    """A cell over csv's own 128 KiB limit is a normal row; one over MAX_ROW_BYTES is set aside."""
    long_prompt = "word " * 40_000  # 200 kB: over csv's default field limit, a fine prompt
    huge = '"' + ('He said ""hi"".\n' * (MAX_ROW_BYTES // 16 + 10)) + '"'  # quotes and newlines
    path = tmp_path / "cells.csv"
    path.write_text(
        "id,prompt\n"
        "a,First prompt\n"
        f"b,{long_prompt}\n"
        f"c,{huge}\n"
        "d,Fourth prompt\n"
        f"e,{'z' * (MAX_ROW_BYTES + 1)}\n"
        "f,Last prompt\n",
        newline="",
    )
    huge_lines = huge.count("\n") + 1

    batch = read_inbox_file(path)

    seeds = {seed.input_id: seed for seed in batch.seeds}
    assert list(seeds) == ["a", "b", "d", "f"]
    assert seeds["b"].prompt == long_prompt
    assert seeds["d"].line == 4 + huge_lines
    assert seeds["f"].line == 6 + huge_lines
    reasons = _reasons(batch)
    assert reasons == {
        4: f"row is over {MAX_ROW_BYTES} characters",
        5 + huge_lines: f"row is over {MAX_ROW_BYTES} characters",
    }
    assert {row.raw[:4] for row in batch.quarantined} == {'c,"H', "e,zz"}


@pytest.mark.parametrize(
    "row",
    [
        {"id": "1", "prompt": "hi", "system": "\ud800"},
        {"id": "1", "prompt": "caf\udce9"},
        {"id": "\udfff", "prompt": "hi"},
        {"id": "1", "messages": [{"role": "user", "content": "a\ud83d"}]},
        {
            "id": "1",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "\ud800"}]}],
        },
        {
            "custom_id": "\ud800",
            "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": "hi"}]},
        },
        # A tool's free text and its free-form `parameters` (values and keys), with an `id`:
        # nothing else (no content hash) would have encoded them before the table's write.
        {"id": "1", "prompt": "hi", "tools": [_tool(description="bad \ud800")]},
        {"id": "1", "prompt": "hi", "tools": [_tool(parameters={"enum": ["a", "b\udfff"]})]},
        {"id": "1", "prompt": "hi", "tools": [_tool(parameters={"properties": {"\ud800": {}}})]},
        {"id": "1", "prompt": "hi", "tools": json.dumps([_tool(description="\ud800")])},
        {
            "custom_id": "1",
            "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": "hi"}], "tools": [_tool("\ud800")]},
        },
    ],
)
def test_lone_surrogates_are_rejected_at_validation(tmp_path: Path, row: dict[str, object]) -> None:
    """A JSON `\\ud800` escape decodes to a str that no UTF-8 encoder (httpx, request_key) takes."""
    path = _jsonl(tmp_path / "surrogate.jsonl", [row, {"id": "ok", "prompt": "fine"}])
    assert "\\ud" in path.read_text()  # written as the escape, exactly as a user file has it

    batch = read_inbox_file(path)

    assert [seed.input_id for seed in batch.seeds] == ["ok"]
    (bad,) = batch.quarantined
    assert bad.line == 1
    assert "has a lone surrogate" in bad.reason, bad.reason
    bad.reason.encode("utf-8")  # the reason and raw text are stored in Parquet
    bad.raw.encode("utf-8")


def test_a_lone_surrogate_in_a_tool_names_where_it_is(tmp_path: Path) -> None:
    parameters = {"type": "object", "properties": {"city": {"description": "x\ud800"}}}
    path = _jsonl(
        tmp_path / "tools.jsonl",
        [{"id": "1", "prompt": "hi", "tools": [_tool(parameters=parameters)]}],
    )

    (bad,) = read_inbox_file(path).quarantined

    assert bad.reason == (
        "tools[0].function.parameters: properties.city.description: has a lone surrogate "
        "'\\ud800' at character 1 (not valid Unicode: a broken escape or a mis-decoded file)"
    )


def test_a_number_json_has_no_room_for_in_a_tool_names_where_it_is(tmp_path: Path) -> None:
    """Python's JSON reader takes `Infinity`, `NaN` and integers of any size; a request cannot
    carry them (llama-server reads doubles), so a kept row would fail its request in every run
    (a long prompt's length check failed the whole partition's seeds)."""
    rows = [
        {"id": str(n), "prompt": "hi", "tools": [_tool(parameters={"maximum": value})]}
        for n, value in enumerate([float("inf"), float("nan"), 10**309, 10**308])
    ]
    path = _jsonl(tmp_path / "tools.jsonl", rows)

    batch = read_inbox_file(path)

    assert [seed.input_id for seed in batch.seeds] == ["3"]  # 1e308 is a double
    assert [row.reason for row in batch.quarantined] == [
        f"tools[0].function.parameters: maximum is {spelling}, which no request can carry "
        "(llama-server reads doubles)"
        for spelling in ("Infinity", "NaN", "an integer past a double's range")
    ]


def test_surrogates_in_a_json_array_keep_raw_encodable(tmp_path: Path) -> None:
    path = tmp_path / "rows.json"
    path.write_text('[{"id": "1", "prompt": "hi", "system": "\\ud800"}]')

    (bad,) = read_inbox_file(path).quarantined

    assert bad.reason.startswith("system: has a lone surrogate '\\ud800' at character 0")
    assert "\\ud800" in bad.raw
    bad.raw.encode("utf-8")


def test_file_over_the_size_limit_is_refused_before_reading(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "big.jsonl", [{"id": str(i), "prompt": "p"} for i in range(100)])
    size = path.stat().st_size

    batch = read_inbox_file(path, max_input_bytes=size - 1)

    assert batch.seeds == []
    (row,) = batch.quarantined
    assert row.reason.startswith("file refused: file is 0.0 MiB, over the input limit of")
    assert (row.line, row.raw) == (None, "big.jsonl")
    assert len(read_inbox_file(path, max_input_bytes=size).seeds) == 100


def test_json_array_over_its_bound_asks_for_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    row = json.dumps({"prompt": "p" * 1000})
    with path.open("w") as file:
        file.write("[" + ",".join([row] * (MAX_JSON_ARRAY_BYTES // len(row) + 1)) + "]")

    batch = read_inbox_file(path)

    assert batch.seeds == []
    (row_out,) = batch.quarantined
    assert row_out.reason.startswith("file refused: a .json file is parsed whole")
    assert row_out.reason.endswith("use JSONL (one row a line) for larger inputs")


@pytest.mark.timeout(60)
def test_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    path = tmp_path / "pipe.jsonl"
    os.mkfifo(path)

    batch = read_inbox_file(path)

    assert batch.seeds == []
    assert [row.reason for row in batch.quarantined] == ["file refused: not a regular file"]


def test_quarantine_rows_are_bounded_with_one_summary(tmp_path: Path) -> None:
    rows: list[object] = []
    for index in range(60):
        rows.append({"id": f"ok-{index}", "prompt": "Fine."})
        rows.append("{broken" if index % 2 else {"id": f"e-{index}", "prompt": ""})
    path = _jsonl(tmp_path / "many.jsonl", rows)

    batch = read_inbox_file(path, max_quarantine_rows=10)

    assert len(batch.seeds) == 60
    assert len(batch.quarantined) == 11
    assert [row.line for row in batch.quarantined[:10]] == list(range(2, 21, 2))
    summary = batch.quarantined[-1]
    assert summary.line is None
    assert summary.reason.startswith("50 more bad rows not listed (only the first 10 are), e.g. ")
    assert "line 22: prompt: must not be empty" in summary.reason
    assert "line 24: invalid JSON" in summary.reason
    assert len(read_inbox_file(path).quarantined) == 60  # the default bound is far higher


def test_streaming_api_yields_rows_in_order_and_chunks(tmp_path: Path) -> None:
    rows: list[object] = [{"id": f"r{i}", "prompt": f"Prompt {i}."} for i in range(25)]
    rows[7] = {"id": "r3", "prompt": "Duplicate id."}
    path = _jsonl(tmp_path / "stream.jsonl", rows)

    items = list(iter_inbox_rows(path, now=NOW))
    chunks = list(in_chunks(iter_inbox_rows(path, now=NOW), chunk_rows=10))

    assert [type(item).__name__ for item in items].count("QuarantineRow") == 1
    duplicate = next(item for item in items if isinstance(item, QuarantineRow))
    assert (duplicate.line, duplicate.reason) == (8, "duplicate input id 'r3' (first on line 4)")
    assert [len(chunk.seeds) for chunk in chunks] == [10, 10, 4]
    assert [len(chunk.quarantined) for chunk in chunks] == [1, 0, 0]
    assert [s for chunk in chunks for s in chunk.seeds] == [
        item for item in items if isinstance(item, SeedPrompt)
    ]
    assert read_inbox_file(path, now=NOW) == InputBatch(
        seeds=[s for c in chunks for s in c.seeds], quarantined=[duplicate]
    )


@pytest.mark.parametrize("ending", [b"\n", b"\r\n"])
def test_jsonl_line_limit_counts_the_content_whatever_the_ending(ending: bytes) -> None:
    """A line of exactly the limit is read with LF and with CRLF; one byte more is over."""
    limit = 32
    exact = b'{"prompt": "' + b"a" * (limit - 14) + b'"}'
    over = b'{"prompt": "' + b"b" * (limit - 13) + b'"}'
    assert len(exact) == limit
    data = ending.join([exact, over, b'{"prompt": "last"}']) + ending

    items = list(jsonl_items(io.BytesIO(data), max_row_bytes=limit))

    assert [(item.line, item.error) for item in items] == [
        (1, None),
        (2, f"line is over {limit} bytes"),
        (3, None),
    ]
    assert [item.record for item in items if item.error is None] == [
        {"prompt": "a" * (limit - 14)},
        {"prompt": "last"},
    ]


def test_parquet_nested_tools_come_back_as_written(tmp_path: Path) -> None:
    """The rows' tool schemas differ: Parquet's struct merges their keys, and each row's keys
    the other did not write read back as nulls, which are not the row's (invalid JSON Schema)."""
    weather = _tool(
        parameters={
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name."},
                # A null list item is a value of its own, not a merged key: it stays.
                "unit": {"enum": ["C", "F", None]},
            },
            "required": ["city"],
        }
    )
    calendar = _tool(
        parameters={"type": "object", "properties": {"date": {"type": "string"}}},
    )
    path = tmp_path / "tools.parquet"
    rows = [
        {"id": "w", "prompt": "Weather?", "tools": [weather]},
        {"id": "c", "prompt": "Today?", "tools": [calendar]},
        {"id": "none", "prompt": "No tools.", "tools": None},
    ]
    # pyarrow (pandas' writer too, through it) merges the rows' keys into one struct type.
    pq.write_table(pa.Table.from_pylist(rows), path)

    batch = read_inbox_file(path)

    assert batch.quarantined == []
    assert [seed.params.tools for seed in batch.seeds] == [[weather], [calendar], None]


def test_parquet_is_read_in_slices_with_running_row_numbers(tmp_path: Path) -> None:
    path = tmp_path / "groups.parquet"
    prompts = [f"Prompt {index}" if index != 6 else "" for index in range(10)]
    pl.DataFrame({"id": list(range(10)), "prompt": prompts}).write_parquet(path, row_group_size=4)

    items = list(parquet_items(path, batch_rows=3))

    assert [item.line for item in items] == list(range(1, 11))
    assert [item.record["id"] for item in items] == list(range(10))
    batch = read_inbox_file(path)
    assert len(batch.seeds) == 9
    assert _reasons(batch) == {7: "prompt: must not be empty"}


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be"])
def test_a_utf16_file_is_one_quarantine_row_naming_the_encoding(
    tmp_path: Path, encoding: str
) -> None:
    lines = [json.dumps({"id": f"r{i}", "prompt": f"question {i}"}) for i in range(5)]
    text = "\n".join(lines) + "\n"
    # "utf-16" writes a BOM (as Windows tools do); the -le/-be codecs write none.
    path = tmp_path / "export.jsonl"
    path.write_bytes(text.encode(encoding))

    batch = read_inbox_file(path, now=NOW)

    assert batch.seeds == []
    (row,) = batch.quarantined
    assert row.line is None
    assert "UTF-16 text; convert to UTF-8" in row.reason


@pytest.mark.parametrize(
    ("name", "content"),
    [("empty.jsonl", b""), ("blank.jsonl", b"\n\n  \n"), ("header.csv", b"prompt\n")],
)
def test_an_empty_input_file_leaves_one_row_saying_so(
    tmp_path: Path, name: str, content: bytes
) -> None:
    path = tmp_path / name
    path.write_bytes(content)

    batch = read_inbox_file(path, now=NOW)

    assert batch.seeds == []
    (row,) = batch.quarantined
    assert "empty" in row.reason
    assert row.source_file == name
