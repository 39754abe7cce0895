"""`kimi-batch export`: a distilled partition as OpenAI Batch API output lines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kimi_batch.errors import ConfigError, MissingInputError
from kimi_batch.settings import Settings
from kimi_batch.storage import Warehouse, validate_ds, validate_source

__all__ = ["export_partition", "openai_batch_lines"]


def openai_batch_lines(
    distilled: list[dict[str, Any]], quarantined: list[dict[str, Any]]
) -> list[str]:
    """One line per answer (`response`) and per failed distillation request (`error`).

    `custom_id` is the input row's id for seeds (so an OpenAI Batch user joins on it as usual)
    and `seed_id:strategy:variant_id` for generated variants.
    """
    lines = []
    for row in distilled:
        custom_id = (
            row["input_id"]
            if row["origin"] == "seed"
            else f"{row['seed_id']}:{row['strategy']}:{row['input_id']}"
        )
        body = {
            "id": f"chatcmpl-{row['request_id']}",
            "object": "chat.completion",
            "created": int(row["created_at"].timestamp()),
            "model": row["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": row["response"]},
                    "finish_reason": row["finish_reason"],
                }
            ],
            "usage": {
                "prompt_tokens": row["prompt_tokens"],
                "completion_tokens": row["completion_tokens"],
                "total_tokens": row["prompt_tokens"] + row["completion_tokens"],
                "prompt_tokens_details": {"cached_tokens": row["cached_tokens"]},
            },
        }
        response = {"status_code": 200, "request_id": row["request_id"], "body": body}
        lines.append(
            json.dumps(
                {
                    "id": f"batch_req_{row['request_id']}",
                    "custom_id": custom_id,
                    "response": response,
                    "error": None,
                },
                ensure_ascii=False,
            )
        )
    for row in quarantined:
        error = {"code": "quarantined", "message": row["reason"]}
        lines.append(
            json.dumps(
                {
                    "id": f"batch_req_{row['request_id'] or row['input_id']}",
                    "custom_id": row["input_id"],
                    "response": None,
                    "error": error,
                },
                ensure_ascii=False,
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
    path = Path(out) if out else settings.home / "exports" / f"distilled-{ds}-{source}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = openai_batch_lines(distilled.to_dicts(), failed.to_dicts())
    temp = path.with_name(f".{path.name}.tmp")
    temp.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    temp.replace(path)
    return path
