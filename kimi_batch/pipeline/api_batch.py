"""The Batch API stage: one OpenAI batch's requests, answered as submitted, as `distilled` rows.

Its inputs are the batch's validated lines (from its landed snapshot, not from an upstream
table), its requests are theirs unchanged (no amplification), and only final answers become rows:
an empty answer, one cut off at max_tokens or one that is not the JSON its `response_format`
asked for is set aside with the reason. An answer that calls tools is final (its
`finish_reason` is `tool_calls`, its text may be empty): the calls are in its `tool_calls`
column. A completion line's row has its raw prompt as `prompt`. The client still gets every answer in its output file
(a cut-off one with `finish_reason: "length"`, as OpenAI returns it): that file is written from
the ledger, not from this table.
"""

from __future__ import annotations

import json
from functools import cached_property
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.batch_api import API_STAGE, BatchRequestLine
from kimi_batch.engine import GenerationRequest, GenerationResult, SystemDigest
from kimi_batch.llama import ToolCall
from kimi_batch.pipeline.distill import EMPTY_REASON, TRUNCATED_REASON
from kimi_batch.pipeline.driver import StagePlan
from kimi_batch.pipeline.generation_task import (
    GenerationTask,
    RowReader,
    SetAside,
    generation_columns,
)
from kimi_batch.pipeline.rows import DistilledRow, GenerationColumns

NOT_JSON_REASON = "answer is not the JSON its response_format asked for"


class ApiBatchInputs(BaseModel):
    """A batch's validated lines, by `custom_id`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    batch_id: str
    lines: list[BatchRequestLine]
    source_file: str

    @cached_property
    def by_id(self) -> dict[str, BatchRequestLine]:
        return {line.custom_id: line for line in self.lines}

    @cached_property
    def system_prompts(self) -> dict[str, SystemDigest]:
        """Each distinct system text of the batch as a digest ('' included: no system turn)."""
        return {
            text: SystemDigest.from_text(text, path=f"{self.batch_id} system prompt")
            for text in dict.fromkeys(line.system for line in self.lines)
        }

    def request(self, line: BatchRequestLine) -> GenerationRequest:
        """The line's request with its system prompt as its own digest, its own sample (batch
        id + `custom_id`) unless its answer is determined: the same line in another batch is
        sampled anew, a rerun finds its answer."""
        return line.request().model_copy(
            update={"sample_scope": self.batch_id, "digest": self.system_prompts[line.system]}
        )


def _tool_calls_json(calls: list[ToolCall]) -> str:
    return json.dumps([call.model_dump(mode="json") for call in calls], ensure_ascii=False)


def _tools_json(tools: list[dict[str, Any]] | None) -> str | None:
    """The request's tools kept with its answer, so a training export can give them back."""
    return json.dumps(tools, ensure_ascii=False) if tools else None


def _structured(text: str) -> str | None:
    """Canonical JSON of an answer asked for as JSON; None when it is not JSON that a row can
    hold. Besides a parse error, `json.loads` raises RecursionError on a deep nest (a model
    looping inside a JSON grammar), ValueError on an integer past 4,300 digits, and reads a
    `\\udXXX` escape with no pair as a lone surrogate the table's UTF-8 cannot store: one such
    answer is its line's, not the whole batch's failure."""
    try:
        # allow_nan=False: 1e999 reads as infinity, which plain dumps writes as `Infinity`,
        # text that is not JSON (a ValueError here: not structured).
        value = json.loads(text)
        canonical = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        canonical.encode()
    except (ValueError, RecursionError):
        return None
    return canonical


class ApiBatchTask(GenerationTask[ApiBatchInputs, DistilledRow]):
    """A Batch API batch (table `distilled`, partition ds=<day created>/source=<batch id>)."""

    name: ClassVar[str] = API_STAGE
    table: ClassVar[str] = "distilled"
    row_model: ClassVar[type[GenerationColumns]] = DistilledRow

    batch_id: str = Field(min_length=1, description="The batch's id (its lines' sample scope).")
    lines: list[BatchRequestLine] = Field(description="The batch's validated requests.")
    source_file: str = Field(description="The batch's landed input, as quarantine names it.")

    def load(self, read: RowReader) -> ApiBatchInputs:
        return ApiBatchInputs(
            batch_id=self.batch_id, lines=self.lines, source_file=self.source_file
        )

    def requests(self, inputs: ApiBatchInputs) -> list[GenerationRequest]:
        return [inputs.request(line) for line in inputs.lines]

    def plan(self, ds: str, source: str, input_sha: str | None) -> StagePlan:
        """The batch as a stage's partition: its lines, landed at ds/source from `input_sha`."""
        inputs = self.load(lambda table, model: [])  # the lines are the inputs: no table read
        return StagePlan(
            task=self,
            ds=ds,
            source=source,
            inputs=inputs,
            requests=self.requests(inputs),
            input_sha=input_sha or "",
        )

    def parse(self, result: GenerationResult, inputs: ApiBatchInputs) -> DistilledRow | SetAside:
        """A result of no line of the batch is a caller bug and raises ValueError."""
        line = inputs.by_id.get(result.input_id)
        if line is None:
            raise ValueError(f"result {result.request_id} is for no request of the batch")
        response = result.text.strip()
        asked_json = line.params.json_schema is not None
        structured = _structured(response) if asked_json else None
        calls = result.tool_calls
        reason = (
            EMPTY_REASON
            if result.empty
            else TRUNCATED_REASON
            if result.truncated
            else NOT_JSON_REASON
            if asked_json and structured is None and not calls
            else None
        )
        if reason is not None:
            return SetAside(reason=reason, source_file=inputs.source_file, line=line.line)
        return DistilledRow.model_validate(
            {
                **generation_columns(result),
                "seed_id": line.custom_id,
                "origin": "seed",
                "strategy": None,
                "prompt": line.prompt,
                "response": response,
                "reasoning": result.reasoning_content or None,
                "structured": structured,
                "logprobs": result.logprobs,
                "tool_calls": _tool_calls_json(calls) if calls else None,
                "tools": _tools_json(line.params.tools),
            }
        )
