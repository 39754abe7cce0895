"""Inbox files of every format, and every kind of bad row, into seeds and quarantine rows."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pytest

from kimi_batch.engine.requests import SamplingParams
from kimi_batch.settings import samples_dir
from kimi_batch.tasks.inputs import (
    INSTRUCTIONS_OPEN,
    RAW_LIMIT,
    InputBatch,
    ParamOverrides,
    SeedPrompt,
    quarantine_overlong,
    read_inbox_file,
)

NOW = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


def _jsonl(path: Path, rows: Sequence[object]) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def _reasons(batch: InputBatch) -> dict[int | None, str]:
    return {row.line: row.reason for row in batch.quarantined}


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
        ("latin1.csv", b"prompt\ncaf\xe9\n", "cannot read file: UnicodeDecodeError"),
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
