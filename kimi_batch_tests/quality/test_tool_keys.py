"""Duplicates of tool-calling answers: the tools offered are part of the question's context, the
calls (function and arguments, not their ids) part of the answer; a row without tools keeps the
keys it was indexed under on earlier nights."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import pytest

from kimi_batch.inputs.prompts import seeds_from_rows
from kimi_batch.llama import ToolCall
from kimi_batch.paths import StatePaths
from kimi_batch.pipeline import DistilledRow, DistillInputs, DistillTask
from kimi_batch.quality import QualityGate, dedup_index
from kimi_batch.quality.dedup_index import IndexedText
from kimi_batch.quality.gate import indexed_text
from kimi_batch.settings import QualitySettings
from kimi_batch.warehouse import Warehouse
from kimi_batch_tests.support.quality import seed_row
from kimi_batch_tests.support.results import make_result

TASK = DistillTask()
DS, SOURCE = "2026-12-01", "night"
QUESTION = "What's the weather in Paris tomorrow?"
Fields = Literal["prompt", "prompt+answer"]


def _tools(name: str) -> str:
    parameters = {"type": "object", "properties": {"city": {"type": "string"}}}
    return json.dumps([{"type": "function", "function": {"name": name, "parameters": parameters}}])


def _call(name: str, arguments: str, call_id: str = "call_1") -> ToolCall:
    return ToolCall.model_validate(
        {"id": call_id, "function": {"name": name, "arguments": arguments}}
    )


def _land(store: Warehouse, offered: Sequence[str | None]) -> DistillInputs:
    """One seed of QUESTION per entry (ids `s0`, `s1`...), offered that tool (None: no tools)."""
    rows = [
        seed_row(f"s{n}", QUESTION, line=n + 1).model_copy(
            update={"tools": _tools(name) if name else None}
        )
        for n, name in enumerate(offered)
    ]
    store.write_partition("seeds", DS, SOURCE, rows)
    return DistillInputs(seeds=seeds_from_rows(rows))


def _answers(
    inputs: DistillInputs, said: Sequence[tuple[str, list[ToolCall]]]
) -> list[DistilledRow]:
    """Each seed's answer: (its text, its tool calls), as the stage parses the engine's result."""
    rows: list[DistilledRow] = []
    for n, (request, (text, calls)) in enumerate(zip(TASK.requests(inputs), said, strict=True)):
        result = make_result(
            text,
            request_id=f"req-{n}",
            input_id=request.input_id,
            tag=request.tag,
            tool_calls=calls,
        )
        row = TASK.parse(result, inputs)
        assert isinstance(row, DistilledRow)
        rows.append(row)
    return rows


def _kept(
    tmp_path: Path, inputs: DistillInputs, rows: list[DistilledRow], fields: Fields
) -> list[str]:
    store = Warehouse(tmp_path / "warehouse")
    gate = QualityGate(QualitySettings(dedup_fields=fields), StatePaths(home=tmp_path).dedup_state)
    with gate.partition(store, TASK, inputs, DS, SOURCE) as screen:
        return [row.input_id for row in screen.admit(rows)]


@pytest.mark.parametrize("fields", ["prompt", "prompt+answer"])
def test_one_question_under_other_tools_is_another_row(tmp_path: Path, fields: Fields) -> None:
    """One question asked without tools, with `get_weather` and with `web_search` offered, the
    last two answered by calls only: the tools were in no key, so under `prompt` all three
    were one row, and under `prompt+answer` the two calls were one (an empty answer)."""
    inputs = _land(Warehouse(tmp_path / "warehouse"), [None, "get_weather", "web_search"])
    rows = _answers(
        inputs,
        [
            ("Look it up on a forecast site.", []),
            ("", [_call("get_weather", '{"city": "Paris"}')]),
            ("", [_call("web_search", '{"city": "Paris"}')]),
        ],
    )
    assert _kept(tmp_path, inputs, rows, fields) == ["s0", "s1", "s2"]


def test_the_same_call_is_a_repeat_whatever_its_id_and_spacing_another_call_is_not(
    tmp_path: Path,
) -> None:
    inputs = _land(Warehouse(tmp_path / "warehouse"), ["get_weather"] * 3)
    rows = _answers(
        inputs,
        [
            ("", [_call("get_weather", '{"city": "Paris", "days": 1}', "call_a")]),
            ("", [_call("get_weather", '{"days":1,"city":"Paris"}', "call_b")]),
            ("", [_call("get_weather", '{"city": "London", "days": 1}', "call_a")]),
        ],
    )
    assert _kept(tmp_path, inputs, rows, "prompt+answer") == ["s0", "s2"]


def test_calls_are_a_part_of_the_key_of_their_own() -> None:
    """An answer's text that spells its calls is not the key of those calls."""
    calls = IndexedText(request_id="a", input_id="a", text="q", answer="", calls=('["f", "{}"]',))
    spelled = IndexedText(request_id="b", input_id="b", text="q", answer='["f", "{}"]')
    assert dedup_index._exact_key(calls) != dedup_index._exact_key(spelled)


# Made by the code before tools were part of the keys: an index of earlier nights holds these.
PLAIN_KEYS = {
    "prompt": "f0b4550610f17bacebea3294a09917b4",
    "prompt+answer": "39a452ae4ffe81200fcf2f52f55957f8",
}
PLAIN_CONTEXT = [
    "answer in one line.",
    "user: <instructions> answer in one line. </instructions> what's the weather in paris?",
    "assistant: sunny, 21 °c.",
]


@pytest.mark.parametrize("fields", sorted(PLAIN_KEYS))
def test_a_row_without_tools_keeps_the_keys_it_was_indexed_under(fields: str) -> None:
    seed = seed_row(
        "s-0",
        "And in Lyon?",
        turns=["What's the weather in Paris?", "Sunny, 21 °C."],
        instructions="Answer  in one LINE.",
    )
    inputs = DistillInputs(seeds=seeds_from_rows([seed]))
    (row,) = _answers(inputs, [("Rainy, 14 °C.", [])])
    indexed = indexed_text(row, TASK.screened(row, inputs), fields)
    assert dedup_index._exact_key(indexed).hex() == PLAIN_KEYS[fields]
    assert json.loads(indexed.context) == PLAIN_CONTEXT
    judged = "and in lyon?" + (" rainy, 14 °c." if fields == "prompt+answer" else "")
    assert indexed.judged == judged  # the MinHash signature's text
