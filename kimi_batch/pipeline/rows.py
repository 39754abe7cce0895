"""Row models of the output tables (`seeds`, `amplified`, `distilled`, `judged`, `quarantine`).

Parquet files and Trino tables share these schemas. The Hive partition columns `ds` and `source`
live in the directory path (`table/ds=YYYY-MM-DD/source=NAME/`), never inside the files, so they
are not fields here; `kimi_batch.warehouse` adds them where a reader needs them.

A quarantine row is built by one builder for every stage (`set_aside_row`, `failure_rows`,
`result_row`): input rows, unusable outputs, failed requests, each with its reason.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from kimi_batch.engine import FailedRequest, GenerationResult
from kimi_batch.llama import TokenLogprob, ToolCall

# ---- the row models -----------------------------------------------------------------------------


PARTITION_COLUMNS: tuple[str, str] = ("ds", "source")


class _Row(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SeedMessage(_Row):
    role: str
    content: str


class SeedRow(_Row):
    """One validated input row, as landed: what every downstream step reads (never the inbox)."""

    request_id: str | None = Field(default=None, description="Null: a seed is not a request.")
    input_id: str = Field(description="Row `id`/`custom_id`, else a content hash.")
    model: str | None = None
    digest_sha256: str | None = None
    prompt_tokens: int | None = Field(
        default=None, description="Exact token count when the length check asked the server."
    )
    cached_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None
    messages: list[SeedMessage] = Field(description="User side; instructions folded in.")
    prompt: str = Field(description="The last user message as written.")
    instructions: str | None = Field(description="The row's own system text, if it had one.")
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    tools: str | None = Field(
        default=None, description="The row's function tools, as OpenAI's `tools` JSON."
    )
    source_file: str = Field(description="Inbox name of the file the row came from.")
    line: int | None = Field(description="1-based line (JSONL/CSV) or row number (Parquet).")
    input_sha256: str = Field(description="sha256 of the landed input file (its snapshot).")
    created_at: datetime


class GenerationColumns(_Row):
    """The contract columns every generated row carries (docs/architecture.md)."""

    request_id: str = Field(description="Content hash of (digest sha, model, params, messages).")
    input_id: str = Field(description="Id of the input row this request was built from.")
    model: str = Field(description="Model alias reported by the server.")
    digest_sha256: str = Field(description="sha256 of the system digest used as prefix.")
    prompt_tokens: int = Field(ge=0, description="Prompt tokens of the request, cached included.")
    cached_tokens: int = Field(ge=0, description="Prompt tokens served from the KV cache.")
    completion_tokens: int = Field(ge=0, description="Tokens generated.")
    finish_reason: str = Field(description="stop | length | error reason from the server.")
    prompt_ms: float = Field(ge=0, description="Server time evaluating the prompt.")
    predicted_ms: float = Field(ge=0, description="Server time generating the answer.")
    latency_ms: float = Field(ge=0, description="Wall time of the request as seen by the client.")
    endpoint: str = Field(description="Base URL of the server that answered.")
    created_at: datetime = Field(description="When the row was written (UTC).")
    input_sha256: str = Field(
        default="", description="sha256 of the landed input version the row was built from."
    )
    draft_tokens: int | None = Field(
        default=None, ge=0, description="Speculative decoding: tokens drafted (null: not used)."
    )
    draft_accepted_tokens: int | None = Field(
        default=None, ge=0, description="Speculative decoding: drafted tokens accepted."
    )


class AmplifiedRow(GenerationColumns):
    """One generated variant of a seed prompt."""

    seed_id: str = Field(description="Input id of the seed it varies.")
    strategy: str = Field(description="paraphrase | harder | related ...")
    prompt: str = Field(description="The variant prompt, parsed from the completion.")


class DistilledRow(GenerationColumns):
    """One teacher answer for a seed or a variant."""

    seed_id: str = Field(description="Input id of the seed (itself, or the variant's).")
    origin: Literal["seed", "variant"] = Field(description="Answer to a seed or to a variant.")
    strategy: str | None = Field(description="Strategy of the variant; null for seeds.")
    prompt: str = Field(description="The prompt answered.")
    response: str = Field(description="The final answer (a reasoning model's thinking apart).")
    reasoning: str | None = Field(
        default=None, description="A reasoning model's thinking (reasoning_content), if any."
    )
    structured: str | None = Field(description="Validated JSON when a schema was requested.")
    logprobs: list[TokenLogprob] | None = Field(description="Top-k logprobs when n_probs > 0.")
    tool_calls: str | None = Field(
        default=None,
        description="The tools the answer calls, as OpenAI's `tool_calls` JSON (null: none).",
    )
    tools: str | None = Field(
        default=None,
        description="The request's function tools, as OpenAI's `tools` JSON (null: none).",
    )

    def calls(self) -> list[ToolCall]:
        """The answer's tool calls, read from `tool_calls` (none when it is null)."""
        return _TOOL_CALLS.validate_json(self.tool_calls) if self.tool_calls else []


_TOOL_CALLS = TypeAdapter(list[ToolCall])


class JudgedRow(GenerationColumns):
    """The judge stage's grade of one teacher answer (a `distilled` row of the same partition)."""

    answer_request_id: str = Field(description="`request_id` of the distilled row graded.")
    score: int = Field(ge=1, le=10, description="The grade, 1 (worst) to 10, by the rubric.")
    reason: str = Field(description="The judge's one-sentence reason.")


class QuarantineRow(_Row):
    """An input row, or a request, that was set aside with the reason."""

    request_id: str | None
    input_id: str | None
    model: str | None
    digest_sha256: str | None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None
    stage: str = Field(description="input, or the generation stage (amplify, distill ...).")
    source_file: str = Field(description="Inbox name of the file, or the table, it came from.")
    line: int | None = Field(description="1-based line (JSONL/CSV) or row number (Parquet).")
    reason: str = Field(description="Why it was set aside, for a person to read.")
    raw: str = Field(description="The offending input, truncated.")
    created_at: datetime
    input_sha256: str | None = Field(
        default=None, description="sha256 of the landed input version the row was built from."
    )


OutputRow = SeedRow | AmplifiedRow | DistilledRow | QuarantineRow


# ---- quarantine rows, one builder for every stage -----------------------------------------------


RAW_LIMIT = 2000

# "input", or the `name` of the generation stage whose output or request it was.
Stage = str
# The stage of input rows (and whole files) set aside while the seeds were landed.
INPUT_STAGE: Stage = "input"


def truncate_raw(text: str, limit: int = RAW_LIMIT) -> str:
    """`text` cut to `limit` characters (an ellipsis marks the cut) for the `raw` column;
    ValueError for a limit under 1."""
    if limit < 1:
        # `text[: limit - 1]` would count from the end: a limit of 0 kept all but one character.
        raise ValueError(f"the limit must be at least 1 character, got {limit}")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def input_row(
    *,
    source_file: str,
    line: int | None,
    reason: str,
    raw: str,
    now: datetime,
    input_id: str | None,
) -> QuarantineRow:
    """An input row (or a whole file, `line` None) set aside with the reason."""
    return QuarantineRow(
        request_id=None,
        input_id=input_id,
        model=None,
        digest_sha256=None,
        stage=INPUT_STAGE,
        source_file=source_file,
        line=line,
        reason=reason,
        raw=truncate_raw(raw),
        created_at=now,
    )


def raw_json(record: Any) -> str:
    """`record` as JSON for the `raw` column, as written where it is valid Unicode."""
    text = json.dumps(record, ensure_ascii=False, default=str)
    # Lone surrogates stay escaped: `raw` is written to Parquet, which needs valid UTF-8.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(record, default=str)
    return text


def rejected_raw(raw: Any, record: Any) -> str:
    """The `raw` column of a rejected row: its text as written, else its value as JSON."""
    if isinstance(raw, str):
        return raw
    try:
        return raw_json(record if raw is None else raw)
    except (ValueError, RecursionError):
        return "(not shown: nested too deeply)"


def file_row(*, source_file: str, reason: str, created_at: datetime) -> QuarantineRow:
    """A whole input file set aside; its content is never copied into `raw`."""
    return input_row(
        source_file=source_file, line=None, reason=reason, raw="", now=created_at, input_id=None
    )


def result_row(
    result: GenerationResult, *, stage: Stage, source_file: str, line: int | None, reason: str
) -> QuarantineRow:
    """An unusable output, pointing at its seed's file and line; the output text is `raw`."""
    return set_aside_row(
        result, stage=stage, source_file=source_file, line=line, reason=reason, raw=result.text
    )


def set_aside_row(
    output: GenerationResult | GenerationColumns,
    *,
    stage: Stage,
    source_file: str,
    line: int | None,
    reason: str,
    raw: str,
    input_sha256: str | None = None,
) -> QuarantineRow:
    """An output set aside (a result, or a row the quality gate keeps out) with its figures."""
    return QuarantineRow(
        request_id=output.request_id,
        input_id=output.input_id,
        model=output.model,
        digest_sha256=output.digest_sha256,
        prompt_tokens=output.prompt_tokens,
        cached_tokens=output.cached_tokens,
        completion_tokens=output.completion_tokens,
        finish_reason=output.finish_reason,
        stage=stage,
        source_file=source_file,
        line=line,
        reason=reason,
        raw=truncate_raw(raw),
        # The output's own time, so that a rerun from the ledger yields identical rows.
        created_at=output.created_at,
        input_sha256=input_sha256,
    )


def failure_rows(
    failures: Sequence[FailedRequest],
    *,
    stage: Stage,
    source_file: str,
    model: str,
    digest_sha: str,
    created_at: datetime,
) -> list[QuarantineRow]:
    """Requests that failed after every attempt; a rerun of the partition retries them."""
    return [
        QuarantineRow(
            request_id=failure.request_id,
            input_id=failure.input_id,
            model=model,
            digest_sha256=digest_sha,
            finish_reason="error",
            stage=stage,
            source_file=source_file,
            line=None,
            reason=f"{failure.reason} (after {failure.attempts} attempts; rerun retries it)",
            raw=failure.tag,
            created_at=created_at,
        )
        for failure in failures
    ]
