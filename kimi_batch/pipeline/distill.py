"""Distillation: teacher answers for seeds and their variants, optionally as validated JSON.

A seed is sent as its own messages (with its row-level overrides); a variant is sent as one user
message with the seed's instructions block and overrides, because a variant is a standalone
question but the requester's style instructions still hold. Downstream a variant is identified by
the `request_id` of its amplified row, which is the `input_id` of its distillation request.

The request tag (`RequestTag`, stage `distill`) carries where the prompt came from: a seed, or a
variant of a strategy.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from functools import cached_property
from typing import ClassVar

from pydantic import BaseModel, Field, ValidationError

from kimi_batch.engine import (
    GenerationRequest,
    GenerationResult,
    SamplingParams,
    fold_instructions,
)
from kimi_batch.inputs import SeedPrompt, format_validation_error
from kimi_batch.llama import ChatMessage, ToolCall
from kimi_batch.pipeline.driver import PartitionSkippedError
from kimi_batch.pipeline.generation_task import (
    DISTILL_STAGE,
    GenerationTask,
    Origin,
    RequestTag,
    RowReader,
    ScreenedText,
    SeedInputs,
    SetAside,
    Strategy,
    generation_columns,
)
from kimi_batch.pipeline.rows import AmplifiedRow, DistilledRow, GenerationColumns

SEED_TAG = RequestTag(stage=DISTILL_STAGE).wire
DEFAULT_DISTILL_PARAMS = SamplingParams(max_tokens=256, temperature=0.7, top_p=0.95)

# Unconstrained models like to wrap JSON in a Markdown fence; the JSON inside is still the answer.
_FENCE_OPEN = re.compile(r"```(?:json)?", re.IGNORECASE)
_FENCE_CLOSE = "```"


def variant_tag(strategy: Strategy | str) -> str:
    """The tag of a variant's distillation request."""
    return RequestTag(stage=DISTILL_STAGE, origin="variant", strategy=Strategy(strategy)).wire


def parse_tag(tag: str) -> tuple[Origin, Strategy | None]:
    """(origin, strategy) from a distillation tag; ValueError on anything else."""
    try:
        parsed = RequestTag.parse(tag)
    except ValueError:
        parsed = None
    # The two forms this stage writes: a seed has no strategy, a variant always has one.
    written = parsed is not None and (parsed.origin == "variant") == (parsed.strategy is not None)
    if parsed is None or parsed.stage != DISTILL_STAGE or not written:
        raise ValueError(f"not a distillation tag: {tag!r}")
    return parsed.origin, parsed.strategy


def distillation_requests(
    seeds: Sequence[SeedPrompt],
    variants: Sequence[AmplifiedRow] = (),
    params: SamplingParams = DEFAULT_DISTILL_PARAMS,
    *,
    n_probs: int = 0,
    output_model: type[BaseModel] | None = None,
) -> list[GenerationRequest]:
    """One request per seed and per variant; `output_model` constrains the answer to its schema."""
    run_params = params.model_copy(
        update={
            "n_probs": n_probs,
            "json_schema": output_model.model_json_schema() if output_model else None,
        }
    )
    # Validate the merged params once: model_copy skips validation (n_probs has bounds).
    run_params = SamplingParams.model_validate(run_params.model_dump())
    by_id = {seed.input_id: seed for seed in seeds}
    requests = [
        GenerationRequest(
            input_id=seed.input_id,
            messages=seed.messages,
            params=seed.sampling_params(run_params),
            tag=SEED_TAG,
        )
        for seed in seeds
    ]
    for variant in variants:
        seed = by_id.get(variant.seed_id)
        if seed is None:
            # Amplified from an older version of the input (its seeds re-landed since, with the
            # amplification skipped): this partition waits for its amplification, the rest go on.
            raise PartitionSkippedError(
                f"its amplified prompts are of an older version of its input (variant "
                f"{variant.request_id} names seed {variant.seed_id!r}, not among the seeds "
                "landed now): materialize amplified_prompts again first"
            )
        content = fold_instructions(seed.instructions, variant.prompt)
        requests.append(
            GenerationRequest(
                input_id=variant.request_id,
                messages=[ChatMessage(role="user", content=content)],
                params=seed.sampling_params(run_params),
                tag=variant_tag(variant.strategy),
            )
        )
    return requests


def _unfenced(text: str) -> str:
    """The text inside a Markdown fence that wraps all of `text` (stripped), else `text`.

    String operations, not one regex: `^```(?:json)?\\s*(.*?)\\s*```$` backtracks cubically on
    an opened fence that never closes (minutes for a few thousand characters of whitespace, as
    a degenerate or cut-off answer writes), on the thread that lands the partition."""
    stripped = text.strip()
    opened = _FENCE_OPEN.match(stripped)
    if opened is None or not stripped.endswith(_FENCE_CLOSE):
        return text
    if len(stripped) < opened.end() + len(_FENCE_CLOSE):  # "`````": the fences overlap
        return text
    return stripped[opened.end() : -len(_FENCE_CLOSE)].strip()


def _structured(
    text: str, output_model: type[BaseModel], finish_reason: str
) -> tuple[str | None, str]:
    """Canonical JSON of the validated answer, or None and the reason."""
    name = output_model.__name__
    try:
        answer = output_model.model_validate_json(_unfenced(text))
    except ValidationError as error:
        reason = f"answer does not match {name}: {format_validation_error(error)}"
        if finish_reason == "length":
            reason += " (cut off at max_tokens)"
        return None, reason
    # A number JSON allows but no float holds (1e999), or NaN, validates as infinity or NaN and
    # is written as null: the row would hold JSON its schema refuses, or (an optional field, a
    # dict's value) an answer the model never gave.
    where = _not_finite(answer.model_dump())
    if where is not None:
        return None, (
            f"answer does not match {name} once written as JSON: {where} holds a number no "
            "float holds, or NaN, which JSON writes as null"
        )
    # By alias: the JSON the schema sent asked for (by_alias is its default), so it validates back.
    canonical = answer.model_dump_json(by_alias=True)
    return canonical, ""


def _not_finite(value: object, path: str = "the answer") -> str | None:
    """The path of the first infinite or NaN float in `value` (a model's dump), if any."""
    if isinstance(value, float):
        return None if math.isfinite(value) else path
    if isinstance(value, dict):
        items = ((f"{path}.{key}", item) for key, item in value.items())  # pyright: ignore
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = ((f"{path}[{i}]", item) for i, item in enumerate(value))  # pyright: ignore
    else:
        return None
    return next((found for at, item in items if (found := _not_finite(item, at))), None)


def _calls_json(result: GenerationResult) -> str | None:
    calls = result.tool_calls
    if not calls:
        return None
    return json.dumps([call.model_dump(mode="json") for call in calls], ensure_ascii=False)


def _canonical_json(text: str) -> str:
    """`text` re-written with sorted keys, so key order and spacing do not count; as written
    when it is no JSON (a model's arguments may not be)."""
    try:
        value: object = json.loads(text)
    except (ValueError, RecursionError):  # also: too deep, a 4,300-digit int
        return text
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def _call_key(call: ToolCall) -> str:
    """A tool call as duplicates are judged: its function and arguments, never its id (a new
    one on every call: two answers making the same call would never be alike)."""
    arguments = _canonical_json(call.function.arguments)
    return json.dumps([call.function.name, arguments], ensure_ascii=False)


TRUNCATED_REASON = (
    "answer cut off at max_tokens (finish_reason=length): not a final answer; raise max_tokens "
    "or set retry_truncated_max_tokens"
)
EMPTY_REASON = "empty answer: not a final answer"


def _set_aside_reason(
    result: GenerationResult, response: str, output_model: type[BaseModel] | None
) -> tuple[str | None, str | None]:
    """(structured JSON, None) for a final answer, else (None, the reason it is not one)."""
    if not response and not result.tool_calls:  # a tool call is a final answer
        return None, EMPTY_REASON
    structured: str | None = None
    if output_model is not None:
        structured, reason = _structured(response, output_model, result.finish_reason)
        if structured is None:
            return None, reason
    if result.truncated:
        return None, TRUNCATED_REASON
    return structured, None


class DistillInputs(SeedInputs):
    """The partition's seeds and the variants amplified from them."""

    variants: list[AmplifiedRow] = Field(default_factory=list)

    @cached_property
    def variants_by_id(self) -> dict[str, AmplifiedRow]:
        return {variant.request_id: variant for variant in self.variants}


class DistillTask(GenerationTask[DistillInputs, DistilledRow]):
    """A teacher answer for every seed and variant (table `distilled`); only final answers are
    rows: an empty answer, one cut off at max_tokens, or one that breaks the schema is set aside
    with the reason (and the text in `raw`), so a student is never trained on half an answer."""

    name: ClassVar[str] = DISTILL_STAGE
    table: ClassVar[str] = "distilled"
    row_model: ClassVar[type[GenerationColumns]] = DistilledRow
    quality_gated: ClassVar[bool] = True

    params: SamplingParams = DEFAULT_DISTILL_PARAMS
    n_probs: int = Field(default=0, ge=0, le=20, description="Top-k logprobs per token (0: off).")
    output_model: type[BaseModel] | None = Field(
        default=None, description="Answers are constrained to its JSON schema and validated."
    )
    retry_truncated_max_tokens: int | None = Field(
        default=None, gt=0, description="Ask truncated answers again with this budget."
    )

    def load(self, read: RowReader) -> DistillInputs:
        seeds = SeedInputs.read(read).seeds
        return DistillInputs(seeds=seeds, variants=read("amplified", AmplifiedRow))

    def requests(self, inputs: DistillInputs) -> list[GenerationRequest]:
        return distillation_requests(
            inputs.seeds,
            inputs.variants,
            self.params,
            n_probs=self.n_probs,
            output_model=self.output_model,
        )

    def parse(self, result: GenerationResult, inputs: DistillInputs) -> DistilledRow | SetAside:
        """A result that matches no seed or variant is a caller bug and raises ValueError."""
        origin, strategy = parse_tag(result.tag)
        if origin == "seed":
            seed = inputs.by_id.get(result.input_id)
            prompt = seed.prompt if seed else ""
        else:
            variant = inputs.variants_by_id.get(result.input_id)
            seed = inputs.by_id.get(variant.seed_id) if variant else None
            prompt = variant.prompt if variant else ""
        if seed is None:
            raise ValueError(f"result {result.request_id} matches no seed or variant")
        response = result.text.strip()
        structured, reason = _set_aside_reason(result, response, self.output_model)
        if reason is not None:
            return SetAside(reason=reason, source_file=seed.source_file, line=seed.line)
        return DistilledRow.model_validate(
            {
                **generation_columns(result),
                "seed_id": seed.input_id,
                "origin": origin,
                "strategy": strategy.value if strategy else None,
                "prompt": prompt,
                "response": response,
                "reasoning": result.reasoning_content or None,
                "structured": structured,
                "logprobs": result.logprobs,
                # The tools kept with the answer: a training export hands both to the trainer.
                "tool_calls": _calls_json(result),
                "tools": json.dumps(seed.params.tools, ensure_ascii=False)
                if seed.params.tools
                else None,
            }
        )

    def screened(self, row: DistilledRow, inputs: DistillInputs) -> ScreenedText:
        """A seed's answer is judged on the seed's conversation, a variant's on the variant
        with the seed's instructions: what the teacher was asked, with the tools it was
        offered; the answer with the tools it called."""
        tools = _canonical_json(row.tools) if row.tools else None
        calls = tuple(_call_key(call) for call in row.calls())
        seed = inputs.by_id.get(row.seed_id)
        if seed is None:
            return ScreenedText(
                prompt=row.prompt,
                answer=row.response,
                source_file="distilled",
                tools=tools,
                tool_calls=calls,
            )
        instructions = (seed.instructions or "").strip()
        if row.origin == "seed":
            prompt = "\n\n".join(message.content for message in seed.messages)
            earlier = [f"{message.role}: {message.content}" for message in seed.messages[:-1]]
            question = seed.prompt
        else:
            prompt = fold_instructions(seed.instructions, row.prompt)
            earlier, question = [], row.prompt
        return ScreenedText(
            prompt=prompt,
            answer=row.response,
            source_file=seed.source_file,
            line=seed.line,
            question=question,
            context=(instructions, *earlier),
            tools=tools,
            tool_calls=calls,
        )

    @property
    def asks_again(self) -> bool:
        return self.retry_truncated_max_tokens is not None

    def retry(
        self, request: GenerationRequest, result: GenerationResult
    ) -> GenerationRequest | None:
        """A truncated answer is asked again with `retry_truncated_max_tokens`."""
        budget = self.retry_truncated_max_tokens
        if budget is None or not result.truncated:
            return None
        return request.model_copy(
            update={"params": request.params.model_copy(update={"max_tokens": budget})}
        )
