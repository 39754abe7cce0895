"""kimi_batch.exports.shape: where the reasoning, the tool calls, the tools and the system turn
go in a trainer's row."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from kimi_batch.exports import (
    ExportExample,
    Layout,
    ReasoningPlacement,
    SystemTurn,
    TrainingOptions,
    assistant_message,
    system_side_file,
    trainer_row,
)
from kimi_batch.exports.conversation import ChatTurn
from kimi_batch.exports.hf import _record as hf_record  # pyright: ignore[reportPrivateUsage]

_CALLS = json.dumps(
    [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]
)
_TOOLS = json.dumps([{"type": "function", "function": {"name": "f", "parameters": {}}}])
_ASKED = [{"role": "system", "content": "digest"}, {"role": "user", "content": "q"}]


def test_reasoning_is_a_field_by_default_inline_in_think_tags_or_dropped() -> None:
    field = assistant_message("A.", "I think.", None, TrainingOptions())
    assert field == {"role": "assistant", "content": "A.", "reasoning_content": "I think."}
    inline = assistant_message("A.", " I think. ", None, TrainingOptions(reasoning="inline"))
    assert inline == {"role": "assistant", "content": "<think>\nI think.\n</think>\n\nA."}
    tags = TrainingOptions(reasoning="inline", think_tags=("<r>", "</r>"))
    assert assistant_message("A.", "x", None, tags)["content"] == "<r>\nx\n</r>\n\nA."
    dropped = assistant_message("A.", "I think.", None, TrainingOptions(reasoning="drop"))
    assert dropped == {"role": "assistant", "content": "A."}
    assert "dropped" in TrainingOptions(reasoning="drop").card_notes[0]


def test_tool_calls_keep_openai_s_shape() -> None:
    message = assistant_message("", None, _CALLS, TrainingOptions())
    assert message["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
    ]
    assert "tool_calls" not in assistant_message("A.", None, None, TrainingOptions())


def test_layouts_and_system_turns() -> None:
    answer = {"role": "assistant", "content": "A."}
    keep = trainer_row(_ASKED, answer, digest_sha256="s", tools=_TOOLS, options=TrainingOptions())
    assert keep == {"messages": [*_ASKED, answer], "tools": json.loads(_TOOLS)}
    options = TrainingOptions(layout="prompt-completion", system_turn="once")
    once = trainer_row(_ASKED, answer, digest_sha256="s", tools=None, options=options)
    assert once == {"prompt": _ASKED[1:], "completion": [answer], "system_sha256": "s"}
    dropped = TrainingOptions(system_turn="drop")
    row = trainer_row(_ASKED, answer, digest_sha256="s", tools=None, options=dropped)
    assert row == {"messages": [_ASKED[1], answer]}
    # A conversation without a system turn loses no user turn.
    row = trainer_row(_ASKED[1:], answer, digest_sha256="s", tools=None, options=dropped)
    assert row == {"messages": [_ASKED[1], answer]}


def test_the_side_file_sits_beside_the_export() -> None:
    assert system_side_file(Path("/x/a.chat.jsonl")) == Path("/x/a.chat.jsonl.system.json")


_TURNS = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant"]), "content": st.text()}
    ),
    max_size=4,
)


@settings(max_examples=300, deadline=None)
@given(
    asked=_TURNS,
    content=st.text(),
    reasoning=st.none() | st.text(),
    layout=st.sampled_from(["messages", "prompt-completion"]),
    placement=st.sampled_from(["field", "inline", "drop"]),
    system=st.sampled_from(["keep", "drop", "once"]),
)
def test_every_shape_keeps_the_turns_and_the_reasoning_where_asked(
    asked: list[dict[str, str]],
    content: str,
    reasoning: str | None,
    layout: Layout,
    placement: ReasoningPlacement,
    system: SystemTurn,
) -> None:
    options = TrainingOptions(layout=layout, reasoning=placement, system_turn=system)
    answer = assistant_message(content, reasoning, None, options)
    row = trainer_row(asked, answer, digest_sha256="s", tools=None, options=options)
    turns = row["messages"] if layout == "messages" else [*row["prompt"], *row["completion"]]
    # Only a leading system turn goes, and only when not kept; the answer is last.
    dropped = system != "keep" and bool(asked) and asked[0]["role"] == "system"
    assert turns == [*asked[int(dropped) :], answer]
    assert content in answer["content"]
    if reasoning and placement == "field":
        assert answer["reasoning_content"] == reasoning
    elif reasoning and placement == "inline":
        assert reasoning.strip() in answer["content"]
    else:
        assert "reasoning_content" not in answer
    assert ("system_sha256" in row) == (system == "once")
    assert json.loads(json.dumps(row)) == row


def test_the_hf_tools_column_keeps_its_text_as_written() -> None:
    """It was ASCII-escaped (`"m\\u00e9t\\u00e9o"`) where the chat export writes `météo`."""
    tools = [{"type": "function", "function": {"name": "météo", "description": "天気"}}]
    example = ExportExample(
        messages=[ChatTurn(role="user", content="Quel temps ?")],
        ds="2026-12-01",
        source="demo",
        request_id="r",
        input_id="i",
        seed_id="i",
        origin="seed",
        strategy=None,
        model="m",
        digest_sha256="0" * 64,
        input_sha256="0" * 64,
        prompt_tokens=1,
        cached_tokens=0,
        completion_tokens=1,
        finish_reason="stop",
        judge_score=None,
        tools=json.dumps(tools, ensure_ascii=False),
    )
    row = hf_record(example, TrainingOptions())  # pyright: ignore[reportPrivateUsage]
    assert isinstance(row["tools"], str)
    assert "météo" in row["tools"]
    assert "天気" in row["tools"]
    assert json.loads(row["tools"]) == tools
