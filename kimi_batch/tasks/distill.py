"""Distillation: teacher answers for seeds and their variants, optionally as validated JSON.

A seed is sent as its own messages (with its row-level overrides); a variant is sent as one user
message with the seed's instructions block and overrides, because a variant is a standalone
question but the requester's style instructions still hold. Downstream a variant is identified by
the `request_id` of its amplified row, which is the `input_id` of its distillation request.

The request tag carries where the prompt came from: `seed`, or `variant:<strategy>`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from kimi_batch.engine import GenerationRequest, GenerationResult, SamplingParams
from kimi_batch.llama import ChatMessage
from kimi_batch.tasks.amplify import Strategy, generation_columns, result_quarantine
from kimi_batch.tasks.inputs import SeedPrompt, fold_instructions, format_validation_error
from kimi_batch.tasks.rows import AmplifiedRow, DistilledRow, QuarantineRow

__all__ = [
    "DEFAULT_DISTILL_PARAMS",
    "EMPTY_REASON",
    "SEED_TAG",
    "TRUNCATED_REASON",
    "VARIANT_TAG_PREFIX",
    "DistillOutcome",
    "distillation_requests",
    "iter_distilled_rows",
    "parse_tag",
    "to_distilled_rows",
    "variant_tag",
]

SEED_TAG = "seed"
VARIANT_TAG_PREFIX = "variant:"
DEFAULT_DISTILL_PARAMS = SamplingParams(max_tokens=256, temperature=0.7, top_p=0.95)

# Unconstrained models like to wrap JSON in a Markdown fence; the JSON inside is still the answer.
_FENCED_JSON = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.IGNORECASE | re.S)


class DistillOutcome(BaseModel):
    """Distilled rows and the results set aside (schema violations)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rows: list[DistilledRow]
    quarantined: list[QuarantineRow]


def variant_tag(strategy: Strategy | str) -> str:
    """The tag of a variant's distillation request."""
    return f"{VARIANT_TAG_PREFIX}{Strategy(strategy).value}"


def parse_tag(tag: str) -> tuple[Literal["seed", "variant"], Strategy | None]:
    """(origin, strategy) from a distillation tag; ValueError on anything else."""
    if tag == SEED_TAG:
        return "seed", None
    if tag.startswith(VARIANT_TAG_PREFIX):
        return "variant", Strategy(tag.removeprefix(VARIANT_TAG_PREFIX))
    raise ValueError(f"not a distillation tag: {tag!r}")


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
            raise ValueError(f"variant {variant.request_id} has unknown seed {variant.seed_id!r}")
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


def _structured(
    text: str, output_model: type[BaseModel], finish_reason: str
) -> tuple[str | None, str]:
    """Canonical JSON of the validated answer, or None and the reason."""
    match = _FENCED_JSON.match(text.strip())
    payload = match.group(1) if match else text
    try:
        value = output_model.model_validate_json(payload)
    except ValidationError as error:
        reason = f"answer does not match {output_model.__name__}: {format_validation_error(error)}"
        if finish_reason == "length":
            reason += " (cut off at max_tokens)"
        return None, reason
    return value.model_dump_json(), ""


TRUNCATED_REASON = (
    "answer cut off at max_tokens (finish_reason=length): not a final answer; raise max_tokens "
    "or set retry_truncated_max_tokens"
)
EMPTY_REASON = "empty answer: not a final answer"


def _set_aside_reason(
    result: GenerationResult, response: str, output_model: type[BaseModel] | None
) -> tuple[str | None, str | None]:
    """(structured JSON, None) for a final answer, else (None, the reason it is not one)."""
    if not response:
        return None, EMPTY_REASON
    structured: str | None = None
    if output_model is not None:
        structured, reason = _structured(response, output_model, result.finish_reason)
        if structured is None:
            return None, reason
    if result.truncated:
        return None, TRUNCATED_REASON
    return structured, None


def iter_distilled_rows(
    results: Iterable[GenerationResult],
    seeds: Sequence[SeedPrompt],
    variants: Sequence[AmplifiedRow] = (),
    *,
    output_model: type[BaseModel] | None = None,
    set_aside: list[QuarantineRow],
) -> Iterator[DistilledRow]:
    """Distillation results as rows, one at a time (results stream from the ledger).

    Only final answers become rows: an empty answer, one cut off at max_tokens, or one that breaks
    the schema goes to `set_aside` with the reason (and the text in `raw`), so a student model is
    never trained on half an answer. A result that matches no seed or variant is a caller bug and
    raises ValueError.
    """
    seeds_by_id = {seed.input_id: seed for seed in seeds}
    variants_by_id = {variant.request_id: variant for variant in variants}
    for result in results:
        origin, strategy = parse_tag(result.tag)
        if origin == "seed":
            seed = seeds_by_id.get(result.input_id)
            prompt = seed.prompt if seed else ""
        else:
            variant = variants_by_id.get(result.input_id)
            seed = seeds_by_id.get(variant.seed_id) if variant else None
            prompt = variant.prompt if variant else ""
        if seed is None:
            raise ValueError(f"result {result.request_id} matches no seed or variant")
        response = result.text.strip()
        structured, reason = _set_aside_reason(result, response, output_model)
        if reason is not None:
            set_aside.append(result_quarantine(result, stage="distill", seed=seed, reason=reason))
            continue
        yield DistilledRow.model_validate(
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
            }
        )


def to_distilled_rows(
    results: Iterable[GenerationResult],
    seeds: Sequence[SeedPrompt],
    variants: Sequence[AmplifiedRow] = (),
    *,
    output_model: type[BaseModel] | None = None,
) -> DistillOutcome:
    """`iter_distilled_rows` collected, rows ordered by (seed, origin, strategy, request id)."""
    quarantined: list[QuarantineRow] = []
    rows = list(
        iter_distilled_rows(
            results, seeds, variants, output_model=output_model, set_aside=quarantined
        )
    )
    rows.sort(key=lambda r: (r.seed_id, r.origin != "seed", r.strategy or "", r.request_id))
    quarantined.sort(key=lambda q: (q.input_id or "", q.request_id or ""))
    return DistillOutcome(rows=rows, quarantined=quarantined)
