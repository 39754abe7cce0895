"""Chat templates as a trainer renders rows: SmolLM2's (from the GGUF) and a reasoning-style one
(reasoning_template.jinja), and the assistant turn's span in a render (issue 45)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2
import jinja2.sandbox
from gguf import GGUFReader

from kimi_batch.settings import default_model_path

__all__ = ["REASONING_TEMPLATE", "assistant_span", "chat_templates"]

REASONING_TEMPLATE = Path(__file__).resolve().parent / "reasoning_template.jinja"


def chat_templates() -> dict[str, jinja2.Template]:
    """`smollm2` (the GGUF's `tokenizer.chat_template`) and `reasoning`."""
    model = default_model_path()
    assert model is not None, "the SmolLM2 model is installed by make setup"
    field = GGUFReader(model).fields["tokenizer.chat_template"]
    smollm2 = bytes(field.parts[field.data[0]]).decode("utf-8")
    # As transformers renders chat templates: a sandbox, blocks trimmed.
    environment = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return {
        "smollm2": environment.from_string(smollm2),
        "reasoning": environment.from_string(REASONING_TEMPLATE.read_text()),
    }


def assistant_span(template: jinja2.Template, row: dict[str, Any]) -> str:
    """The rendered assistant turn of a `messages` or prompt-completion row: what follows the
    rendered prompt (the part assistant-only or completion-only loss trains on)."""
    if "messages" in row:
        prompt, completion = row["messages"][:-1], row["messages"][-1:]
    else:
        prompt, completion = row["prompt"], row["completion"]
    tools = row.get("tools")
    before = template.render(messages=prompt, tools=tools, add_generation_prompt=False)
    whole = template.render(messages=[*prompt, *completion], tools=tools)
    assert whole.startswith(before), "the prompt's render is not a prefix of the row's"
    span = whole[len(before) :]
    assert completion[0]["role"] == "assistant"
    assert "assistant" in span
    return span
