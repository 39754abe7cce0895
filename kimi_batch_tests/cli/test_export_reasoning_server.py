"""A distillation whose reasoning comes from the real llama-server exports in every layout and
keeps it (issue 45, done-when): SmolLM2 served with a chat template that opens the assistant
turn with <think> (support/reasoning_template.jinja), the server's own `--reasoning-format
deepseek` splitting the thinking off into `reasoning_content`.

Tool calls: this llama.cpp build finds no tool-call format in the test templates (see
defs/test_api_batch_fields.py), so it parses no calls from SmolLM2; the export of calls is
tested with a recorded answer in the OpenAI shape (test_export_shapes.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import datasets
import pytest

from kimi_batch.cli.export import ExportRequest, run_export
from kimi_batch.exports import ExportQuery, TrainingOptions
from kimi_batch.settings import Settings
from kimi_batch.warehouse import Warehouse
from kimi_batch_tests.support.batches import answered, chat_line, jsonl, landed_batch
from kimi_batch_tests.support.chat_templates import (
    REASONING_TEMPLATE,
    assistant_span,
    chat_templates,
)
from kimi_batch_tests.support.llama_server import LlamaEnv, server_with_args

pytestmark = pytest.mark.slow  # answers a batch on a real llama-server

# Two earlier turns show SmolLM2-135M the pattern (think, close the block, answer); at
# temperature 0 it follows it after the <think> the template opens its turn with, so the server
# has reasoning and an answer to split.
_SHOTS = [
    ("What color is grass?", "<think>\nGrass is green.\n</think>\n\nGreen."),
    ("What color is snow?", "<think>\nSnow is white.\n</think>\n\nWhite."),
]
_ASK = "What color is the sky?"


def _conversation() -> list[dict[str, str]]:
    turns: list[dict[str, str]] = []
    for question, answer in _SHOTS:
        turns += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    return [*turns, {"role": "user", "content": _ASK}]


@pytest.fixture
def thinking_server(
    llama_env: LlamaEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Settings]:
    """The same model with the reasoning template and the server's reasoning parser."""
    del llama_env  # its variables (model, binary, threads, slots) are this server's too
    extra_args = f"--jinja --chat-template-file {REASONING_TEMPLATE} --reasoning-format deepseek"
    with server_with_args(monkeypatch, tmp_path / "home", extra_args) as settings:
        yield settings


def test_the_server_s_reasoning_survives_every_layout(
    thinking_server: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    settings = thinking_server
    line = chat_line("think", max_tokens=48, temperature=0, messages=_conversation())
    batch = landed_batch(settings, jsonl(line))
    with dg.instance_for_test() as instance:
        answered(settings, instance, batch)
    assert batch.ds is not None
    rows = Warehouse(settings.paths.warehouse_dir).read_partition("distilled", batch.ds, batch.id)
    assert rows.height == 1, "the answer was set aside (see the quarantine partition)"
    reasoning, answer = rows["reasoning"][0], rows["response"][0]
    assert reasoning, f"the server split off no reasoning: {answer!r}"
    query = ExportQuery(source=batch.id)
    templates = chat_templates()
    for layout in ("messages", "prompt-completion"):
        for placement in ("field", "inline"):
            training = TrainingOptions.model_validate({"layout": layout, "reasoning": placement})
            out = settings.home / f"{layout}-{placement}.jsonl"
            run_export(settings, ExportRequest(fmt="chat", out=out, query=query, training=training))
            [row] = [json.loads(text) for text in out.read_text().splitlines()]
            # Both templates render the row and its answer; SmolLM2's renders `content` only,
            # so it shows the reasoning when it is inline.
            for name, template in templates.items():
                span = assistant_span(template, row)
                assert answer.strip() in span, (name, layout, placement, span)
                if placement == "inline" or name == "reasoning":
                    assert reasoning.strip() in span, (name, layout, placement, span)
            loaded = datasets.load_dataset("json", data_files=str(out), split="train")
            assert loaded.num_rows == 1
        training = TrainingOptions.model_validate({"layout": layout})
        folder = run_export(settings, ExportRequest(fmt="hf", query=query, training=training))
        [row] = datasets.load_dataset(str(folder), split="train").to_list()
        assert reasoning.strip() in assistant_span(templates["reasoning"], row)
