"""Batch API helpers for tests: wait for a batch's validation, write batch input lines, land a
batch straight into a store (no API in between)."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Mapping
from typing import Any

import dagster as dg
import openai
from openai.types import Batch

from kimi_batch.batch_api import ApiStore, BatchRecord, validate_batch
from kimi_batch.settings import Settings, default_model_path

__all__ = ["MODEL", "answered", "chat_line", "jsonl", "landed_batch", "validated"]

# The name the Batch API accepts for the test model (its file stem, the served `--alias`); any
# name passes when no model is installed (nothing to compare with).
_MODEL_PATH = default_model_path()
MODEL = _MODEL_PATH.name.removesuffix(".gguf") if _MODEL_PATH is not None else "any"


def chat_line(custom_id: str, content: str = "Say hi.", **body: object) -> dict[str, object]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": MODEL, "messages": [{"role": "user", "content": content}], **body},
    }


def jsonl(*rows: object) -> bytes:
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def validated(client: openai.OpenAI, batch: Batch, *, timeout_s: float = 120.0) -> Batch:
    """The batch once its validation ended: failed or cancelled, or landed (its request total
    known) and waiting for its run (`validating`, or `cancelling` until the run ends it)."""
    deadline = time.monotonic() + timeout_s
    while True:
        batch = client.batches.retrieve(batch.id)
        counts = batch.request_counts
        landed = counts is not None and counts.total > 0
        if batch.status not in ("validating", "cancelling") or landed:
            return batch
        if time.monotonic() > deadline:
            raise AssertionError(f"{batch.id} is still validating after {timeout_s} s")
        time.sleep(0.05)


def landed_batch(
    settings: Settings,
    data: bytes,
    *,
    filename: str = "in.jsonl",
    store: ApiStore | None = None,
    endpoint: str = "/v1/chat/completions",
) -> BatchRecord:
    """A batch of the input file `data` for `endpoint`, created and validated (landed) as the
    API does it, in `store` (a test's open one) or the state dir's."""
    if store is None:
        with ApiStore(settings.paths) as opened:
            return landed_batch(settings, data, filename=filename, store=opened, endpoint=endpoint)
    upload = store.add_file(io.BytesIO(data), filename=filename, purpose="batch", max_bytes=1 << 20)
    batch = store.add_batch(
        input_file_id=upload.id,
        endpoint=endpoint,
        completion_window="24h",
        completion_window_s=86400,
        metadata=None,
    )
    return validate_batch(settings, store, batch)


def answered(
    settings: Settings,
    instance: dg.DagsterInstance,
    batch: BatchRecord,
    resources: Mapping[str, object] | None = None,
) -> dict[str, Any]:
    """Run the batch's partition of `api_batch_responses` in process (it must succeed); the
    values of its materialization's metadata. `resources` default to the deployment's."""
    from kimi_batch.definitions import build_resources
    from kimi_batch.defs.assets.api_batch import api_batch_responses
    from kimi_batch.defs.partitions import API_BATCH_PARTITIONS_NAME

    instance.add_dynamic_partitions(API_BATCH_PARTITIONS_NAME, [batch.id])
    result = dg.materialize(
        [api_batch_responses],
        partition_key=batch.id,
        resources=resources or build_resources(settings),
        instance=instance,
    )
    (materialization,) = result.asset_materializations_for_node("api_batch_responses")
    return {key: value.value for key, value in materialization.metadata.items()}
