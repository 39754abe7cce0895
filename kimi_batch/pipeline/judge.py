"""The judge stage: the same resident model grades every teacher answer against a rubric.

Each `distilled` row of the partition becomes one request: the rubric, the request (and the tools
it offered) and the answer (and the tools it called) in the user turn (the digest stays the
system prompt, so its cached prefill is reused), the answer constrained to the JSON schema of
`Verdict` ({score: 1-10, reason}). Greedy decoding with a fixed seed: a judgement is
determined, so a rerun (or the same answer in another partition) costs nothing twice, and a
changed rubric is a new request (the rubric is in the ledger key).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kimi_batch.engine import GenerationRequest, GenerationResult, SamplingParams
from kimi_batch.inputs import format_validation_error
from kimi_batch.llama import ChatMessage, ToolCall
from kimi_batch.pipeline.generation_task import (
    GenerationTask,
    RequestTag,
    RowReader,
    SetAside,
    generation_columns,
)
from kimi_batch.pipeline.rows import DistilledRow, GenerationColumns, JudgedRow

JUDGE_STAGE = "judge"
# A verdict is a score and one sentence: ~40 tokens; the rest is headroom for a long reason.
DEFAULT_JUDGE_PARAMS = SamplingParams(max_tokens=160, temperature=0.0, seed=1)


class Verdict(BaseModel):
    """What the judge answers (its JSON schema constrains the answer)."""

    model_config = ConfigDict(extra="forbid")

    score: int = Field(ge=1, le=10)
    reason: str = Field(min_length=1, max_length=500)


class JudgeInputs(BaseModel):
    """The partition's teacher answers, by request id."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    answers: list[DistilledRow]

    @cached_property
    def by_id(self) -> dict[str, DistilledRow]:
        return {answer.request_id: answer for answer in self.answers}


def judge_prompt(
    rubric: str,
    prompt: str,
    response: str,
    *,
    tools: str | None = None,
    tool_calls: Sequence[ToolCall] = (),
) -> str:
    """The user turn of one judgement: the rubric, then the request (with the `tools` offered,
    OpenAI's JSON) and the answer (with the `tool_calls` it made).

    An answer that only calls a tool has no text: without its calls the judge would grade it
    as empty. A row with neither gets the prompt it always had (its ledger key is made of it).
    """
    offered = f"\n\n## Tools offered\n{tools}" if tools else ""
    answer = response
    if tool_calls:
        calls = "\n".join(f"{call.function.name}({call.function.arguments})" for call in tool_calls)
        answer = (
            f"{response or '(no text: the answer is its tool calls)'}\n\n## Tool calls\n{calls}"
        )
    return (
        f"{rubric.strip()}\n\n## Request\n{prompt}{offered}\n\n## Answer\n{answer}\n\n"
        'Reply with the JSON object {"score": ..., "reason": ...} only.'
    )


class JudgeTask(GenerationTask[JudgeInputs, JudgedRow]):
    """A 1-10 score and a reason for every teacher answer (table `judged`); a reply that is not
    a verdict is set aside with the reason."""

    name: ClassVar[str] = JUDGE_STAGE
    table: ClassVar[str] = "judged"
    row_model: ClassVar[type[GenerationColumns]] = JudgedRow

    rubric: str = Field(min_length=1, description="What the answers are graded by.")
    params: SamplingParams = DEFAULT_JUDGE_PARAMS

    def load(self, read: RowReader) -> JudgeInputs:
        return JudgeInputs(answers=read("distilled", DistilledRow))

    def requests(self, inputs: JudgeInputs) -> list[GenerationRequest]:
        params = self.params.model_copy(update={"json_schema": Verdict.model_json_schema()})
        tag = RequestTag(stage=JUDGE_STAGE).wire
        return [
            GenerationRequest(
                input_id=answer.request_id,
                messages=[
                    ChatMessage(
                        role="user",
                        content=judge_prompt(
                            self.rubric,
                            answer.prompt,
                            answer.response,
                            tools=answer.tools,
                            tool_calls=answer.calls(),
                        ),
                    )
                ],
                params=params,
                tag=tag,
            )
            for answer in inputs.answers
        ]

    def measure(self, row: JudgedRow) -> Mapping[str, float]:
        return {f"score_{row.score}": 1, "score_sum": row.score}

    def summarize(self, sums: Mapping[str, float], rows: int) -> dict[str, float]:
        """The score distribution (rows per score, 1 to 10), its mean and the weak answers."""
        counts = {f"score_{n}": sums.get(f"score_{n}", 0) for n in range(1, 11)}
        return {
            **counts,
            "score_mean": round(sums.get("score_sum", 0) / rows, 2) if rows else 0.0,
            "scored_below_5": sum(counts[f"score_{n}"] for n in range(1, 5)),
        }

    def parse(self, result: GenerationResult, inputs: JudgeInputs) -> JudgedRow | SetAside:
        """A result for no answer of the partition is a caller bug (ValueError)."""
        if result.input_id not in inputs.by_id:
            raise ValueError(f"result {result.request_id} grades no distilled answer")
        try:
            verdict = Verdict.model_validate_json(result.text.strip())
        except ValidationError as error:
            cut = " (cut off at max_tokens)" if result.truncated else ""
            reason = f"not a verdict: {format_validation_error(error)}{cut}"
            return SetAside(reason=reason, source_file="distilled")
        return JudgedRow.model_validate(
            {
                **generation_columns(result),
                "answer_request_id": result.input_id,
                "score": verdict.score,
                "reason": verdict.reason,
            }
        )
