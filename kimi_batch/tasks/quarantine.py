"""Quarantine rows: one builder for every stage (input rows, unusable outputs, failed requests)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from kimi_batch.engine import FailedRequest, GenerationResult
from kimi_batch.tasks.inputs import input_row, truncate_raw
from kimi_batch.tasks.rows import QuarantineRow

__all__ = ["failure_rows", "file_row", "result_row"]

# "input", or the `name` of the generation stage whose output or request it was.
Stage = str


def file_row(*, source_file: str, reason: str, created_at: datetime) -> QuarantineRow:
    """A whole input file set aside; its content is never copied into `raw`."""
    return input_row(
        source_file=source_file, line=None, reason=reason, raw="", now=created_at, input_id=None
    )


def result_row(
    result: GenerationResult, *, stage: Stage, source_file: str, line: int | None, reason: str
) -> QuarantineRow:
    """An unusable output, pointing at its seed's file and line; the output text is `raw`."""
    return QuarantineRow(
        request_id=result.request_id,
        input_id=result.input_id,
        model=result.model,
        digest_sha256=result.digest_sha256,
        prompt_tokens=result.prompt_tokens,
        cached_tokens=result.cached_tokens,
        completion_tokens=result.completion_tokens,
        finish_reason=result.finish_reason,
        stage=stage,
        source_file=source_file,
        line=line,
        reason=reason,
        raw=truncate_raw(result.text),
        # The result's own time, so that a rerun from the ledger yields identical rows.
        created_at=result.created_at,
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
