"""Adding a stage is one class: a test-only `GenerationTask` runs end to end on the real server.

Everything the stage needs is in this file: its row model, its class, and the one registration
line (`generation_asset`). The engine, the ledger, the sink, the quarantine table and the Parquet
writer are the shared ones.
"""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime

import dagster as dg
import pytest

from kimi_batch.definitions import batch_assets, build_resources
from kimi_batch.defs.assets.stage import generation_asset
from kimi_batch.defs.partitions import SOURCE_PARTITIONS_NAME, build_batch_partitions
from kimi_batch.engine import GenerationRequest, GenerationResult, SamplingParams
from kimi_batch.llama import ChatMessage
from kimi_batch.settings import Settings
from kimi_batch.storage import Warehouse
from kimi_batch.tasks.rows import GenerationColumns
from kimi_batch.tasks.stage import (
    GenerationTask,
    RowReader,
    SeedInputs,
    SetAside,
    generation_columns,
)
from kimi_batch.tasks.tags import RequestTag
from kimi_batch_tests.support.llama_server import LlamaEnv

pytestmark = pytest.mark.slow  # materializes on a real llama-server


class EchoLengthRow(GenerationColumns):
    seed_id: str
    prompt_chars: int
    reply: str


class EchoLengthTask(GenerationTask[SeedInputs, EchoLengthRow]):
    """Ask the teacher to echo each seed's length in characters."""

    name = "echo_length"
    table = "echo_lengths"
    row_model = EchoLengthRow

    def load(self, read: RowReader) -> SeedInputs:
        return SeedInputs.read(read)

    def requests(self, inputs: SeedInputs) -> list[GenerationRequest]:
        return [
            GenerationRequest(
                input_id=seed.input_id,
                messages=[
                    ChatMessage(role="user", content=f"Reply with the number {len(seed.prompt)}.")
                ],
                params=SamplingParams(max_tokens=8, temperature=0.0, seed=1),
                tag=RequestTag(stage=self.name).wire,
            )
            for seed in inputs.seeds
        ]

    def parse(self, result: GenerationResult, inputs: SeedInputs) -> EchoLengthRow | SetAside:
        seed = inputs.seed_of(result)
        if result.empty:
            return SetAside(reason="empty reply", source_file=seed.source_file, line=seed.line)
        return EchoLengthRow.model_validate(
            {
                **generation_columns(result),
                "seed_id": seed.input_id,
                "prompt_chars": len(seed.prompt),
                "reply": result.text.strip(),
            }
        )


# The one registration line (over the deployment's partitions, as the batch assets are built).
def echo_lengths(partitions: dg.PartitionsDefinition) -> dg.AssetsDefinition:
    return generation_asset(
        name="echo_lengths",
        task=EchoLengthTask(),
        partitions=partitions,
        deps=["seed_prompts"],
        description="Echoed lengths.",
    )


PROMPTS = {"e1": "What is a noun?", "e2": "Name a planet.", "e3": "Why is the sky blue?"}


def test_a_stage_of_one_class_runs_through_engine_ledger_and_parquet(llama_env: LlamaEnv) -> None:
    inbox = llama_env.home / "inbox"
    inbox.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"id": key, "prompt": prompt}) for key, prompt in PROMPTS.items()]
    (inbox / "echo.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    today = datetime.now(UTC).date().isoformat()
    key = dg.MultiPartitionKey({"date": today, "source": "echo"})
    settings = Settings.from_env()
    seed_prompts = batch_assets(settings)[0]
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(SOURCE_PARTITIONS_NAME, ["echo"])
        runs = [
            dg.materialize(
                [seed_prompts, echo_lengths(build_batch_partitions(settings))],
                partition_key=key,
                resources=build_resources(settings),
                instance=instance,
            )
            for _ in range(2)
        ]
    assert all(run.success for run in runs)

    table = Warehouse(llama_env.home / "warehouse").read_partition("echo_lengths", today, "echo")
    assert sorted(table["seed_id"].to_list()) == sorted(PROMPTS)
    assert dict(zip(table["seed_id"], table["prompt_chars"], strict=True)) == {
        key: len(prompt) for key, prompt in PROMPTS.items()
    }
    assert table["request_id"].n_unique() == len(PROMPTS)
    assert (table["completion_tokens"] > 0).all()

    first, second = (run.asset_materializations_for_node("echo_lengths")[0] for run in runs)
    assert first.metadata["generated"].value == len(PROMPTS)
    # The rerun asks nothing: every row comes back from the ledger, keyed by content hash.
    assert second.metadata["generated"].value == 0
    assert second.metadata["from_ledger"].value == len(PROMPTS)
    assert second.metadata["rows"].value == len(PROMPTS)
    with sqlite3.connect(llama_env.home / "ledger" / "ledger.sqlite3") as db:
        tags = [json.loads(row[0])["tag"] for row in db.execute("SELECT result_json FROM results")]
    assert [RequestTag.parse(tag).stage for tag in tags].count("echo_length") == len(PROMPTS)
