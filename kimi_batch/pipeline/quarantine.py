"""Quarantine rows: one builder for every stage (input rows, unusable outputs, failed requests)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from kimi_batch.engine import FailedRequest, GenerationResult
from kimi_batch.pipeline.rows import GenerationColumns, QuarantineRow

RAW_LIMIT = 2000

# "input", or the `name` of the generation stage whose output or request it was.
Stage = str
# The stage of input rows (and whole files) set aside while the seeds were landed.
INPUT_STAGE: Stage = "input"


def truncate_raw(text: str, limit: int = RAW_LIMIT) -> str:
    """`text` cut to `limit` characters (an ellipsis marks the cut) for the `raw` column."""
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
