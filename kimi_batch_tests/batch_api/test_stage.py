"""The Batch API stage (`lifecycle.ApiBatchTask`): requests as submitted, each with its system
prompt as its digest; final answers as rows."""

from __future__ import annotations

import json
from typing import Any

from kimi_batch.batch_api import NOT_JSON_REASON, ApiBatchTask
from kimi_batch.batch_api.lines import parse_batch_input
from kimi_batch.llama import ToolCall
from kimi_batch.pipeline import StageSink
from kimi_batch_tests.support.results import make_result

URL = "/v1/chat/completions"


def line(custom_id: str, system: str | None = None, **body: Any) -> bytes:
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": f"Question {custom_id}?"})
    body["messages"] = messages
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": URL, "body": body}).encode()


def task_of(*lines: bytes, batch_id: str = "batch_x") -> ApiBatchTask:
    parsed = parse_batch_input(lines, endpoint=URL)
    assert parsed.errors == []
    return ApiBatchTask(batch_id=batch_id, lines=parsed.lines, source_file=f"{batch_id}.jsonl")


def test_requests_are_the_batch_s_own_each_with_its_system_prompt_as_its_digest() -> None:
    task = task_of(line("a", "Be terse."), line("b"), line("c", "Be terse.", max_tokens=9))
    inputs = task.load(lambda table, model: [])
    requests = task.requests(inputs)
    assert [r.input_id for r in requests] == ["a", "b", "c"]
    assert all(r.messages[0].role == "user" for r in requests)  # the system is the digest
    assert requests[2].params.max_tokens == 9
    digests = [r.digest for r in requests]
    assert [d.text if d else None for d in digests] == ["Be terse.", "", "Be terse."]
    assert digests[0] is digests[2]  # one digest per distinct prompt, shared by its lines
    assert list(inputs.system_prompts) == ["Be terse.", ""]
    assert {r.tag for r in requests} == {"api/seed"}


def test_each_line_that_samples_is_its_own_sample_in_its_own_batch() -> None:
    def samples(batch_id: str, **body: Any) -> list[str | None]:
        task = task_of(line("a", **body), line("b", **body), batch_id=batch_id)
        return [r.sample for r in task.requests(task.load(lambda table, model: []))]

    first = samples("batch_1", temperature=1.0)
    assert len(set(first)) == 2
    assert None not in first
    assert samples("batch_1", temperature=1.0) == first  # a rerun: the same samples
    assert not set(samples("batch_2", temperature=1.0)) & set(first)  # another batch: new ones
    # A determined answer (greedy, or a fixed seed) is nobody's own: shared by every line.
    assert samples("batch_1", temperature=0.0) == [None, None]
    assert samples("batch_2", seed=3) == [None, None]


def test_only_final_answers_become_distilled_rows() -> None:
    task = task_of(
        line("ok"),
        line("cut"),
        line("json", response_format={"type": "json_object"}),
        line("notjson", response_format={"type": "json_object"}),
    )
    texts = {"ok": "Hello.", "cut": "Hel", "json": '{"a": 1}', "notjson": "no"}
    results = [
        make_result(
            texts[custom_id],
            request_id=f"r-{custom_id}",
            input_id=custom_id,
            tag="api/seed",
            finish_reason="length" if custom_id == "cut" else "stop",
        )
        for custom_id in texts
    ]
    sink = StageSink(task, task.load(lambda table, model: []))
    rows = list(sink.rows(results))
    assert [(r.seed_id, r.origin, r.structured) for r in rows] == [
        ("ok", "seed", None),
        ("json", "seed", '{"a":1}'),
    ]
    assert [(q.input_id, q.line, q.stage) for q in sink.quarantined] == [
        ("cut", 2, "api"),
        ("notjson", 4, "api"),
    ]
    assert "max_tokens" in sink.quarantined[0].reason
    assert sink.figures().truncated == 1


def test_json_no_row_can_hold_sets_its_line_aside_not_the_batch() -> None:
    """A loop inside a JSON grammar, an integer past Python's 4,300 digits, an unpaired
    `\\udXXX` escape: each raised out of the stage (a RecursionError, a ValueError, or the
    table's UTF-8 write) and failed every line of the batch, on every rerun."""
    answers = {
        "deep": "[" * 1200 + "]" * 1200,
        "huge": "9" * 5000,
        "surrogate": '{"a": "\\ud800"}',
        # Infinity once written back: `Infinity` is not JSON (it was stored as structured).
        "infinite": '{"a": 1e999}',
        "nan": "[NaN]",
        "fine": '{"a": "\\ud83d\\ude00"}',
    }
    task = task_of(*(line(c, response_format={"type": "json_object"}) for c in answers))
    results = [
        make_result(text, request_id=f"r-{c}", input_id=c, tag="api/seed")
        for c, text in answers.items()
    ]
    sink = StageSink(task, task.load(lambda table, model: []))
    rows = list(sink.rows(results))
    assert [(r.seed_id, r.structured) for r in rows] == [("fine", '{"a":"\U0001f600"}')]
    assert [(q.input_id, q.reason) for q in sink.quarantined] == [
        ("deep", NOT_JSON_REASON),
        ("huge", NOT_JSON_REASON),
        ("surrogate", NOT_JSON_REASON),
        ("infinite", NOT_JSON_REASON),
        ("nan", NOT_JSON_REASON),
    ]


def test_an_answer_that_calls_a_tool_is_final_and_keeps_its_calls() -> None:
    tools = [{"type": "function", "function": {"name": "get_weather"}}]
    task = task_of(line("call", tools=tools, tool_choice="required"), line("empty"))
    call = ToolCall.model_validate(
        {"id": "c", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}
    )
    results = [
        make_result("", input_id="call", tag="api/seed", finish_reason="tool_calls",
                    tool_calls=[call]),
        make_result("", input_id="empty", tag="api/seed"),
    ]  # fmt: skip
    sink = StageSink(task, task.load(lambda table, model: []))
    [row] = list(sink.rows(results))
    assert (row.seed_id, row.response, row.finish_reason) == ("call", "", "tool_calls")
    assert row.tool_calls is not None
    assert json.loads(row.tool_calls) == [call.model_dump(mode="json")]
    assert [q.input_id for q in sink.quarantined] == ["empty"]
    assert sink.figures().empty == 1


def test_an_answer_keeps_its_request_s_tools_and_one_without_none() -> None:
    tools = [{"type": "function", "function": {"name": "get_weather"}}]
    task = task_of(line("tools", tools=tools), line("plain"))
    results = [
        make_result("Sunny.", input_id="tools", tag="api/seed"),
        make_result("Hi.", input_id="plain", tag="api/seed"),
    ]
    sink = StageSink(task, task.load(lambda table, model: []))
    rows = {row.seed_id: row for row in sink.rows(results)}
    assert rows["tools"].tools is not None
    assert json.loads(rows["tools"].tools) == tools
    assert rows["plain"].tools is None


def test_a_completion_line_s_row_has_its_raw_prompt() -> None:
    body = {"prompt": "Once upon a time", "max_tokens": 4}
    raw = {"custom_id": "c", "method": "POST", "url": "/v1/completions", "body": body}
    parsed = parse_batch_input([json.dumps(raw).encode()], endpoint="/v1/completions")
    task = ApiBatchTask(batch_id="b", lines=parsed.lines, source_file="b.jsonl")
    inputs = task.load(lambda table, model: [])
    [request] = task.requests(inputs)
    assert (request.kind, request.raw_prompt) == ("completion", "Once upon a time")
    assert request.digest is not None
    assert request.digest.text == ""  # nothing in front of a raw prompt
    [row] = list(StageSink(task, inputs).rows([make_result(" there", input_id="c")]))
    assert (row.prompt, row.response, row.tool_calls) == ("Once upon a time", "there", None)
