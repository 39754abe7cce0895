"""`kimi-batch export`: a distilled partition as OpenAI Batch API output lines.

The lines come from the one writer of `kimi_batch.tasks.openai_batch` that the Batch API's
output and error files use too. The file holds prompts' answers: it is written 0600 (temp,
fsync, rename), the folders it creates are 0700 (the default `$KIMI_BATCH_HOME/exports` always),
and the temp files of an export killed midway are removed by the next export there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kimi_batch.errors import ConfigError, MissingInputError
from kimi_batch.llama import TokenLogprob
from kimi_batch.paths import private_dir
from kimi_batch.settings import Settings
from kimi_batch.storage import (
    Warehouse,
    validate_ds,
    validate_source,
    write_private_text,
)
from kimi_batch.tasks.openai_batch import AnsweredRequest, error_line, response_line

__all__ = ["export_custom_id", "export_partition", "openai_batch_lines"]


def export_custom_id(input_id: str, variant: tuple[str, str] | None) -> str:
    """The input row's id for a seed (an OpenAI Batch user joins on it as usual), and
    `seed_id:strategy:variant_id` for a generated variant: answered or set aside alike."""
    if variant is None:
        return input_id
    seed_id, strategy = variant
    return f"{seed_id}:{strategy}:{input_id}"


def _answer(row: dict[str, Any]) -> AnsweredRequest:
    variant = None if row["origin"] == "seed" else (row["seed_id"], row["strategy"])
    logprobs = row.get("logprobs")
    return AnsweredRequest(
        custom_id=export_custom_id(row["input_id"], variant),
        request_id=row["request_id"],
        model=row["model"],
        created_at=row["created_at"],
        content=row["response"],
        reasoning=row.get("reasoning"),
        logprobs=[TokenLogprob.model_validate(t) for t in logprobs] if logprobs else None,
        finish_reason=row["finish_reason"],
        prompt_tokens=row["prompt_tokens"],
        completion_tokens=row["completion_tokens"],
        cached_tokens=row["cached_tokens"],
    )


def openai_batch_lines(
    distilled: list[dict[str, Any]],
    quarantined: list[dict[str, Any]],
    variants: dict[str, tuple[str, str]] | None = None,
) -> list[str]:
    """One line per answer (`response`) and per failed distillation request (`error`).

    `variants`: variant request id -> (seed_id, strategy), from the `amplified` table, so a
    set-aside variant gets the same `custom_id` its answer would have had.
    """
    lines = [response_line(_answer(row)) for row in distilled]
    for row in quarantined:
        input_id = row["input_id"] or ""
        lines.append(
            error_line(
                custom_id=export_custom_id(input_id, (variants or {}).get(input_id)),
                request_id=row["request_id"],
                code="quarantined",
                message=row["reason"],
            )
        )
    return lines


def export_partition(
    settings: Settings, *, ds: str, source: str, fmt: str, out: str | None
) -> Path:
    if fmt != "openai-batch":
        raise ConfigError(f"unknown export format {fmt!r}")
    ds, source = validate_ds(ds), validate_source(source)
    warehouse = Warehouse(settings.paths.warehouse_dir)
    distilled = warehouse.read_partition("distilled", ds, source)
    if distilled.is_empty() and not warehouse.partition_file("distilled", ds, source).is_file():
        raise MissingInputError(f"no distilled partition ds={ds} source={source}")
    quarantine = warehouse.read_partition("quarantine", ds, source)
    failed = (
        quarantine.filter(quarantine["stage"] == "distill") if quarantine.height else quarantine
    )
    amplified = warehouse.read_partition("amplified", ds, source)
    variants = (
        {row["request_id"]: (row["seed_id"], row["strategy"]) for row in amplified.to_dicts()}
        if amplified.height
        else {}
    )
    if out:
        path = Path(out)
    else:
        # Ours: made owner-only even when an older version created it 0755.
        path = private_dir(settings.home / "exports") / f"distilled-{ds}-{source}.jsonl"
    lines = openai_batch_lines(distilled.to_dicts(), failed.to_dicts(), variants)
    return write_private_text(path, "".join(line + "\n" for line in lines))
