"""`kimi-batch export --format chat --reasoning/--layout/--system/--include-batches` met as
a trainer meets it: every layout renders through SmolLM2's chat template (from the GGUF) and a
reasoning-style one (support/reasoning_template.jinja), the assistant turn's span is found as
assistant-only loss finds it, and the rows load with `datasets` (issue 45, items 1-3)."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path
from typing import Any

import datasets
import pytest
from huggingface_hub import DatasetCard

from kimi_batch.cli.commands import main
from kimi_batch.cli.export import ExportRequest, run_export
from kimi_batch.crash_points import CrashPointReached, armed
from kimi_batch.engine import SystemDigest, load_digest
from kimi_batch.errors import ConfigError
from kimi_batch.exports import ExportQuery, TrainingOptions, system_side_file
from kimi_batch.pipeline import DistilledRow
from kimi_batch.settings import Settings
from kimi_batch.warehouse import open_warehouse
from kimi_batch_tests.support.batches import chat_line, jsonl, landed_batch
from kimi_batch_tests.support.chat_templates import assistant_span, chat_templates
from kimi_batch_tests.support.exports import BATCH_SOURCE, DAYS, SOURCES, build_warehouse
from kimi_batch_tests.support.rows import amplified, distilled

_THINKING = "The capital of France is Paris, so I say Paris."
_CALL = {
    "id": "call_0",
    "type": "function",
    "function": {"name": "get_capital", "arguments": '{"country": "France"}'},
}
_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_capital",
            "parameters": {"type": "object", "properties": {"country": {"type": "string"}}},
        },
    }
]


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path / "home"))
    return Settings.from_env()


def _reasoning_warehouse(settings: Settings) -> None:
    """The export warehouse, the first partition's answers with reasoning, one with a tool
    call and its request's tools."""
    warehouse = build_warehouse(settings)
    ds, source = DAYS[0], SOURCES[0]
    rows = warehouse.read_partition("distilled", ds, source).drop("ds", "source").to_dicts()
    rows = [{**row, "reasoning": _THINKING} for row in rows]
    rows[0] |= {"tool_calls": json.dumps([_CALL]), "tools": json.dumps(_TOOLS)}
    warehouse.write_partition("distilled", ds, source, _as_rows(rows))


def _as_rows(rows: list[dict[str, Any]]) -> list[DistilledRow]:
    return [DistilledRow.model_validate(row) for row in rows]


def _export(settings: Settings, **options: Any) -> Path:
    day = date.fromisoformat(DAYS[0])
    query = ExportQuery(since=day, until=day, source=SOURCES[0])
    training = TrainingOptions.model_validate(options)
    return run_export(settings, ExportRequest(fmt="chat", query=query, training=training))


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("layout", ["messages", "prompt-completion"])
@pytest.mark.parametrize("reasoning", ["field", "inline", "drop"])
def test_every_layout_renders_with_its_reasoning_and_tool_calls(
    settings: Settings, layout: str, reasoning: str
) -> None:
    _reasoning_warehouse(settings)
    path = _export(settings, layout=layout, reasoning=reasoning)
    rows = _lines(path)
    assert len(rows) == 3
    templates = chat_templates()
    for row in rows:
        assert set(row) - {"tools"} == (
            {"messages"} if layout == "messages" else {"prompt", "completion"}
        )
        answer = (row.get("messages") or row["completion"])[-1]
        for name, template in templates.items():
            span = assistant_span(template, row)
            if reasoning == "drop":
                assert _THINKING not in span
            # SmolLM2's template renders `content` only: the reasoning is in its render when
            # inline; the reasoning-style template renders `reasoning_content` too.
            elif reasoning == "inline" or name == "reasoning":
                assert f"<think>\n{_THINKING}\n</think>" in span, (name, span)
            if name == "reasoning" and "tool_calls" in answer:
                assert '"name": "get_capital"' in span
                assert '"country": "France"' in span
    assert rows[0].get("tools") == _TOOLS
    first = (rows[0].get("messages") or rows[0]["completion"])[-1]
    assert first["tool_calls"] == [_CALL]
    assert all("tools" not in row for row in rows[1:])  # no tools asked, no column value
    loaded = datasets.load_dataset("json", data_files=str(path), split="train")
    assert loaded.num_rows == 3
    column = "messages" if layout == "messages" else "completion"
    reloaded = loaded[0][column][-1]
    assert reloaded["tool_calls"][0]["function"]["name"] == "get_capital"
    if reasoning == "field":
        assert reloaded["reasoning_content"] == _THINKING


def test_system_turn_once_writes_the_digest_once_and_rows_name_it(settings: Settings) -> None:
    _reasoning_warehouse(settings)
    keep = _export(settings)
    kept = keep.stat().st_size
    once = _export(settings, system_turn="once")
    digest = load_digest(settings.digest)
    side = json.loads(system_side_file(once).read_text())
    assert side == {digest.sha256: digest.text}
    rows = _lines(once)
    assert all(row["system_sha256"] == digest.sha256 for row in rows)
    assert all(m["role"] != "system" for row in rows for m in row["messages"])
    # Each row lost the digest: the file is smaller by about the digest's share.
    assert kept - once.stat().st_size >= len(rows) * (len(digest.text) - 100)
    loaded = datasets.load_dataset("json", data_files=str(once), split="train")
    assert loaded["system_sha256"] == [digest.sha256] * 3


def test_system_turn_once_names_an_empty_digest_too(settings: Settings) -> None:
    """A batch line without a system text was asked under the empty digest: its rows name
    that digest, and the side file holds its (empty) text."""
    batch_id = _tool_batch(settings, system=False)
    once = TrainingOptions(system_turn="once")
    query = ExportQuery(source=batch_id)
    path = run_export(settings, ExportRequest(fmt="chat", query=query, training=once))
    empty = SystemDigest.from_text("")
    assert {row["system_sha256"] for row in _lines(path)} == {empty.sha256}
    assert json.loads(system_side_file(path).read_text()) == {empty.sha256: ""}


def test_system_turn_drop_is_no_system(settings: Settings) -> None:
    _reasoning_warehouse(settings)
    rows = _lines(_export(settings, system_turn="drop"))
    assert [row["messages"][0]["role"] for row in rows] == ["user"] * 3
    assert all("system_sha256" not in row for row in rows)


def test_the_shape_options_apply_to_chat_and_hf_not_kd(settings: Settings) -> None:
    _reasoning_warehouse(settings)
    training = TrainingOptions(layout="prompt-completion")
    with pytest.raises(ConfigError, match="chat and hf rows"):
        run_export(settings, ExportRequest(fmt="kd", training=training))


def test_a_kd_row_carries_the_answer_s_reasoning_tool_calls_and_tools(settings: Settings) -> None:
    """A kd row is the default chat row plus the tokens: what a trainer renders for the
    prompt and the answer is the same in both (merge of items 1-3 with item 4)."""
    _reasoning_warehouse(settings)
    day = date.fromisoformat(DAYS[0])
    query = ExportQuery(since=day, until=day, source=SOURCES[0])
    rows = _lines(run_export(settings, ExportRequest(fmt="kd", query=query)))
    chat = _lines(_export(settings))
    assert len(rows) == len(chat) == 3
    for row, chat_row in zip(rows, chat, strict=True):
        assert row["messages"] == chat_row["messages"]
        assert row["messages"][-1]["reasoning_content"] == _THINKING
        assert row.get("tools") == chat_row.get("tools")
        assert row["logprobs"]["content"]  # and the tokens, as kd's own tests check them
    assert rows[0]["messages"][-1]["tool_calls"] == [_CALL]
    assert rows[0]["tools"] == _TOOLS


def test_a_kd_export_without_the_system_turn(settings: Settings) -> None:
    """`--no-system` (`--system drop`) only leaves the digest out: kd rows take it as they
    did before the shape options, only the options that reshape the row are chat's and hf's."""
    _reasoning_warehouse(settings)
    out = settings.home / "no-system.kd.jsonl"
    for flag in ("--no-system", "--system-turn=drop", "--system=drop"):
        argv = ["export", "--format", "kd", "--source", SOURCES[0], flag, "--out", str(out)]
        assert main(argv) == 0
        rows = _lines(out)
        assert len(rows) == len(DAYS) * 3
        assert {row["messages"][0]["role"] for row in rows} == {"user"}
    assert main(["export", "--format", "kd", "--system-turn", "once", "--out", str(out)]) == 2


def test_system_names_the_turn_or_an_older_digest_file(
    settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by audit: the design's `--system keep|drop|once` read `drop` as a digest file
    ("system digest file drop does not exist"); `--system FILE` still adds an older digest."""
    _reasoning_warehouse(settings)
    out = settings.home / "turns.jsonl"
    base = ["export", "--format", "chat", "--source", SOURCES[0], "--out", str(out)]

    assert main([*base, "--system", "once"]) == 0
    assert all("system_sha256" in row for row in _lines(out))
    assert main([*base, "--system", "drop"]) == 0
    assert {row["messages"][0]["role"] for row in _lines(out)} == {"user"}
    older = settings.home / "drop"  # a file named like a turn is given as a path
    older.write_text("an older digest\n", encoding="utf-8")
    assert main([*base, "--system", "keep", "--system", f"{older.parent}/./drop"]) == 0
    assert main([*base, "--system", "once", "--system-turn", "drop"]) == 2
    assert "the system turn asked two ways: drop and once" in capsys.readouterr().err


def test_an_hf_card_says_how_its_rows_are_shaped(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The card's notes name where the reasoning went, and that `--reasoning drop` left it
    out (TrainingOptions.card_notes reach CardOptions.notes)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _reasoning_warehouse(settings)
    query = ExportQuery(source=SOURCES[0])
    notes: dict[str, str] = {}
    for reasoning in ("field", "drop"):
        training = TrainingOptions.model_validate({"reasoning": reasoning, "system_turn": "once"})
        request = ExportRequest(fmt="hf", query=query, training=training)
        notes[reasoning] = DatasetCard.load(run_export(settings, request) / "README.md").text
    assert "reasoning was dropped from this export (--reasoning drop)" in notes["drop"]
    assert "dropped" not in notes["field"]
    assert "assistant message's `reasoning_content`" in notes["field"]
    for text in notes.values():
        assert "`system_sha256` names it (--system once)" in text
        assert "the teacher model's license" in text  # the card's own notes stay


@pytest.mark.parametrize("layout", ["messages", "prompt-completion"])
def test_an_hf_export_keeps_reasoning_tool_calls_and_tools(settings: Settings, layout: str) -> None:
    _reasoning_warehouse(settings)
    query = ExportQuery(source=SOURCES[0])
    training = TrainingOptions.model_validate({"layout": layout, "system_turn": "once"})
    folder = run_export(settings, ExportRequest(fmt="hf", query=query, training=training))
    loaded = datasets.load_dataset(str(folder), split="train")
    assert loaded.num_rows == len(DAYS) * 3
    templates = chat_templates()
    digest = load_digest(settings.digest)
    rows: list[dict[str, Any]] = loaded.to_list()
    first_day = [row for row in rows if row["ds"] == DAYS[0]]
    called = [row for row in first_day if row["tools"]]
    assert len(called) == 1
    assert json.loads(called[0]["tools"]) == _TOOLS
    for row in first_day:
        trainer = {**row, "tools": json.loads(row["tools"]) if row["tools"] else None}
        span = assistant_span(templates["reasoning"], trainer)
        assert f"<think>\n{_THINKING}\n</think>" in span
        assert row["system_sha256"] == digest.sha256
    trainer = {**called[0], "tools": _TOOLS}
    assert '"name": "get_capital"' in assistant_span(templates["reasoning"], trainer)
    side = json.loads((folder / "system.json").read_text())
    assert side == {digest.sha256: digest.text}


def _tool_batch(settings: Settings, *, system: bool = True) -> str:
    """A landed Batch API batch of two lines, the first with tools; its answers written (the
    first calling the tool, its row without `tools`, as rows were before they kept them)."""
    head = [{"role": "system", "content": "You are terse."}] if system else []
    lines = [
        chat_line("t-0", tools=_TOOLS, messages=[*head, {"role": "user", "content": "Capital?"}]),
        chat_line("t-1", messages=[*head, {"role": "user", "content": "Say 1."}]),
    ]
    batch = landed_batch(settings, jsonl(*lines))
    digest = SystemDigest.from_text("You are terse." if system else "").sha256
    answers = distilled(amplified(2))
    answers = [
        answers[0].model_copy(
            update={"seed_id": "t-0", "digest_sha256": digest, "tool_calls": json.dumps([_CALL])}
        ),
        answers[1].model_copy(update={"seed_id": "t-1", "digest_sha256": digest}),
    ]
    assert batch.ds is not None
    open_warehouse(settings).write_partition("distilled", batch.ds, batch.id, answers)
    return batch.id


def test_a_batch_line_with_tools_exports_its_tools_and_tool_calls(settings: Settings) -> None:
    build_warehouse(settings)
    # Its stand-in batch partition has no batch in the state dir: this test lands a real one.
    open_warehouse(settings).write_partition("distilled", DAYS[1], BATCH_SOURCE, [])
    batch_id = _tool_batch(settings)
    out = settings.home / "all.chat.jsonl"
    assert main(["export", "--format", "chat", "--include-batches", "--out", str(out)]) == 0
    rows = _lines(out)
    assert len(rows) == len(DAYS) * len(SOURCES) * 3 + 2
    [called] = [row for row in rows if "tools" in row]
    assert called["tools"] == _TOOLS
    assert called["messages"][-1]["tool_calls"] == [_CALL]
    assert called["messages"][:2] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Capital?"},
    ]
    # Without --include-batches the batch stays out; --source names it alone.
    assert main(["export", "--format", "chat", "--out", str(out)]) == 0
    assert len(_lines(out)) == len(DAYS) * len(SOURCES) * 3
    assert main(["export", "--format", "chat", "--source", batch_id, "--out", str(out)]) == 0
    assert sum("tools" in row for row in _lines(out)) == 1


def test_an_export_stopped_after_its_side_file_keeps_the_older_rows_digests(
    settings: Settings,
) -> None:
    """The side file is renamed in before the rows: stopped between the two, the older rows
    (another digest's) still find their text in it, and a rerun writes both."""
    _reasoning_warehouse(settings)
    older = SystemDigest.from_text("An older digest.")
    out = settings.home / "once.jsonl"
    system_side_file(out).parent.mkdir(parents=True, exist_ok=True)
    system_side_file(out).write_text(json.dumps({older.sha256: older.text}))
    out.write_text(json.dumps({"messages": [], "system_sha256": older.sha256}) + "\n")
    request = ExportRequest(
        fmt="chat",
        out=out,
        query=ExportQuery(source=SOURCES[0]),
        training=TrainingOptions(system_turn="once"),
    )
    with armed("export.system_side_file"), pytest.raises(CrashPointReached):
        run_export(settings, request)
    digest = load_digest(settings.digest)
    side = json.loads(system_side_file(out).read_text())
    assert side == {older.sha256: older.text, digest.sha256: digest.text}
    assert [row["system_sha256"] for row in _lines(out)] == [older.sha256]  # the older rows
    run_export(settings, request)
    assert {row["system_sha256"] for row in _lines(out)} == {digest.sha256}
