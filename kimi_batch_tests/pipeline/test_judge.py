"""The judge stage's requests and verdicts: one request per answer, a verdict or a set-aside."""

from __future__ import annotations

import json

import pytest

from kimi_batch.pipeline import (
    DistilledRow,
    JudgedRow,
    JudgeInputs,
    JudgeTask,
    RequestTag,
    SetAside,
    StageSink,
    Verdict,
    judge_prompt,
)
from kimi_batch.settings.defaults import default_judge_rubric_path
from kimi_batch_tests.support.results import make_result
from kimi_batch_tests.support.rows import amplified, distilled

RUBRIC = default_judge_rubric_path().read_text(encoding="utf-8")


@pytest.fixture
def inputs() -> JudgeInputs:
    return JudgeInputs(answers=distilled(amplified(3)))


def test_every_answer_is_one_greedy_request_with_the_rubric_and_the_verdict_schema(
    inputs: JudgeInputs,
) -> None:
    task = JudgeTask(rubric=RUBRIC)
    requests = task.requests(inputs)
    assert [r.input_id for r in requests] == [a.request_id for a in inputs.answers]
    for request, answer in zip(requests, inputs.answers, strict=True):
        (message,) = request.messages
        assert message.role == "user"
        content = message.content
        assert isinstance(content, str)
        # The rubric first (a prefix every judgement shares), then what was asked and answered.
        assert content.startswith(RUBRIC.strip()[:60])
        assert content.index(answer.prompt) < content.index(answer.response)
        assert request.params.json_schema == Verdict.model_json_schema()
        assert request.params.determined  # a rerun, or the same answer elsewhere, asks nothing
        assert RequestTag.parse(request.tag).stage == "judge"
    # The rubric is part of every request: another rubric is another request (another key).
    other = JudgeTask(rubric="Grade harshly.").requests(inputs)
    assert other[0].messages != requests[0].messages


def test_a_verdict_is_a_judged_row_of_the_answer(inputs: JudgeInputs) -> None:
    answer = inputs.answers[1]
    text = json.dumps({"score": 8, "reason": "Correct and clear."})
    row = JudgeTask(rubric=RUBRIC).parse(
        make_result(text, request_id="j1", input_id=answer.request_id, tag="judge"), inputs
    )
    assert isinstance(row, JudgedRow)
    assert (row.answer_request_id, row.score, row.reason) == (
        answer.request_id,
        8,
        "Correct and clear.",
    )
    assert row.request_id == "j1"


@pytest.mark.parametrize(
    ("text", "finish_reason", "expected"),
    [
        ('{"score": 11, "reason": "great"}', "stop", "less than or equal to 10"),
        ("Eight out of ten.", "stop", "not a verdict"),
        ('{"score": 7, "reas', "length", "(cut off at max_tokens)"),
    ],
)
def test_a_reply_that_is_no_verdict_is_set_aside_with_the_reason(
    inputs: JudgeInputs, text: str, finish_reason: str, expected: str
) -> None:
    result = make_result(
        text, input_id=inputs.answers[0].request_id, tag="judge", finish_reason=finish_reason
    )
    parsed = JudgeTask(rubric=RUBRIC).parse(result, inputs)
    assert isinstance(parsed, SetAside)
    assert parsed.reason.startswith("not a verdict")
    assert expected in parsed.reason
    assert parsed.source_file == "distilled"


def test_a_result_of_no_answer_is_a_caller_bug(inputs: JudgeInputs) -> None:
    with pytest.raises(ValueError, match="grades no distilled answer"):
        JudgeTask(rubric=RUBRIC).parse(make_result("{}", input_id="nobody"), inputs)


def test_the_partitions_score_distribution_is_its_metadata(inputs: JudgeInputs) -> None:
    task = JudgeTask(rubric=RUBRIC)
    results = [
        make_result(
            json.dumps({"score": score, "reason": "r"}),
            request_id=f"j{i}",
            input_id=answer.request_id,
            tag="judge",
        )
        for i, (answer, score) in enumerate(zip(inputs.answers, [9, 9, 3], strict=True))
    ]
    sink = StageSink(task, inputs)
    assert [row.score for row in sink.rows(results)] == [9, 9, 3]
    figures = sink.metadata()
    assert (figures["score_9"], figures["score_3"], figures["score_10"]) == (2, 1, 0)
    assert figures["score_mean"] == 7.0
    assert figures["scored_below_5"] == 1


WEATHER_TOOLS = json.dumps(
    [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
)


def _judged_prompt(answer: DistilledRow) -> str:
    (request,) = JudgeTask(rubric="Grade the answer 1-10.").requests(JudgeInputs(answers=[answer]))
    (message,) = request.messages
    assert isinstance(message.content, str)
    return message.content


def test_a_tool_calling_answer_is_shown_with_its_calls_and_the_tools_offered(
    inputs: JudgeInputs,
) -> None:
    """An answer that only calls a tool has no text: the judge saw an empty answer."""
    calls = [
        {"id": "call_7f3a", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}
    ]
    answer = inputs.answers[0].model_copy(
        update={
            "prompt": "What's the weather in Paris?",
            "response": "",
            "tool_calls": json.dumps(calls),
            "tools": WEATHER_TOOLS,
        }
    )
    content = _judged_prompt(answer)
    shown = [
        "## Request\nWhat's the weather in Paris?",
        f"## Tools offered\n{WEATHER_TOOLS}",
        "## Answer\n(no text: the answer is its tool calls)",
        '## Tool calls\nget_weather({"city":"Paris"})',
    ]
    for part in shown:
        assert part in content
    assert [content.index(part) for part in shown] == sorted(content.index(part) for part in shown)
    assert "call_7f3a" not in content  # the call's id says nothing of the answer

    # Text beside the calls is shown as the answer; tools offered and not called still show.
    said = answer.model_copy(update={"response": "Let me check."})
    assert "## Answer\nLet me check.\n\n## Tool calls\nget_weather(" in _judged_prompt(said)
    unused = answer.model_copy(update={"response": "Sunny.", "tool_calls": None})
    assert f"## Tools offered\n{WEATHER_TOOLS}\n\n## Answer\nSunny.\n\nReply" in _judged_prompt(
        unused
    )


def test_an_answer_without_tools_gets_the_prompt_it_always_had(inputs: JudgeInputs) -> None:
    """The prompt is in the judgement's ledger key: a changed one would grade it again."""
    answer = inputs.answers[0].model_copy(
        update={"prompt": "Capital of France?", "response": "Paris."}
    )
    assert _judged_prompt(answer) == (
        "Grade the answer 1-10.\n\n## Request\nCapital of France?\n\n## Answer\nParis.\n\n"
        'Reply with the JSON object {"score": ..., "reason": ...} only.'
    )
    assert judge_prompt("Grade it.", "Why?", "Because.") == (
        "Grade it.\n\n## Request\nWhy?\n\n## Answer\nBecause.\n\n"
        'Reply with the JSON object {"score": ..., "reason": ...} only.'
    )
