"""Which seeds are too long for a slot, decided locally for almost all rows.

A byte-level BPE token covers at least one byte, so a text never has more tokens than UTF-8
bytes (an SPM tokenizer may add one leading-space token: `+1` a message). A seed whose bytes,
with the digest and the chat template, fit the limit fits for sure; only the others are sent
to `/tokenize`, in the caller's client session, a few at a time. Measured on SmolLM2 (ChatML):
no text had more tokens than bytes, and the template added 8.5 + 5.5 tokens a turn (system turn
and generation prompt in the 8.5); the constants below leave room for other templates.

The function tools a row offers count too: the chat template writes their JSON schemas into the
prompt (the client sends tools only to a template that renders them). The byte bound counts
them as their JSON with an indent of 4, never shorter than a template's `tojson` (compact or
indented up to 4, non-ASCII as it is), plus an allowance for the template's words about tools;
a doubtful row with tools is counted exactly: its messages and tools as the server's chat
template renders them (`/apply-template`), tokenized, so a row that fits is never set aside
for an estimate.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from kimi_batch.inputs import InputBatch, SeedPrompt
from kimi_batch.llama import (
    ChatMessage,
    LlamaClient,
    LlamaHTTPError,
    LlamaResponseError,
)
from kimi_batch.pipeline.rows import QuarantineRow, input_row, raw_json

TEMPLATE_TOKENS_FIXED = 16
TEMPLATE_TOKENS_PER_TURN = 8
TEMPLATE_TOKENS_TOOLS = 256
TEMPLATE_TOKENS_PER_TOOL = 16
TOKENIZE_CONCURRENCY = 4


def template_tokens(messages: int) -> int:
    """Tokens the chat template adds around the digest and `messages` user-side turns."""
    return TEMPLATE_TOKENS_FIXED + TEMPLATE_TOKENS_PER_TURN * messages


def tools_text(seed: SeedPrompt) -> str | None:
    """The row's tools as they are counted (JSON, indent 4), or None when it offers none."""
    tools = seed.params.tools
    return json.dumps(tools, ensure_ascii=False, indent=4) if tools else None


def tools_template_tokens(seed: SeedPrompt) -> int:
    """Tokens the chat template adds around the row's tools (none without tools)."""
    tools = seed.params.tools
    return TEMPLATE_TOKENS_TOOLS + TEMPLATE_TOKENS_PER_TOOL * len(tools) if tools else 0


def token_bound(seed: SeedPrompt) -> int:
    """More tokens than the seed's messages and tools can have: their UTF-8 bytes, plus one
    each."""
    text = tools_text(seed)
    tools = len(text.encode("utf-8")) + 1 if text is not None else 0
    return tools + sum(len(message.content.encode("utf-8")) + 1 for message in seed.messages)


# The digest's place in a rendered prompt: an empty system turn, so that a template that writes
# a default system prompt when there is none (Qwen2.5's) does not count one the request lacks.
_DIGEST_TURN = ChatMessage(role="system", content="")


@dataclass
class _TemplateRoute:
    """Whether the server renders a prompt with tools (`/apply-template`): yes until it first
    refuses, so the other rows of a check ask no more."""

    renders: bool = True


async def _rendered_tokens(client: LlamaClient, seed: SeedPrompt, route: _TemplateRoute) -> int:
    """A seed with tools in tokens, the digest's text aside: its messages and tools as the chat
    template renders them (exact); where the server cannot render them (no `/apply-template`;
    without jinja llama-server answers 500 "tools param requires --jinja flag"), its messages'
    and tools' text plus the template's allowances."""
    if route.renders:
        tools = seed.params.tools or []
        try:
            rendered = await client.apply_template([_DIGEST_TURN, *seed.messages], tools=tools)
            return len(await client.tokenize(rendered, add_special=True))
        except (LlamaHTTPError, LlamaResponseError):
            route.renders = False
    text = "\n".join([*(m.content for m in seed.messages), tools_text(seed) or ""])
    allowance = template_tokens(len(seed.messages)) + tools_template_tokens(seed)
    return allowance + len(await client.tokenize(text))


async def _prompt_tokens(client: LlamaClient, seeds: Sequence[SeedPrompt]) -> list[int]:
    """Each seed's prompt in tokens, the digest's text aside: with tools, as the chat template
    renders it (`_rendered_tokens`); without, its messages' text plus the template's allowance
    (measured above)."""
    gate = asyncio.Semaphore(TOKENIZE_CONCURRENCY)
    route = _TemplateRoute()

    async def count(seed: SeedPrompt) -> int:
        async with gate:
            if seed.params.tools:
                return await _rendered_tokens(client, seed, route)
            text = "\n".join(m.content for m in seed.messages)
            return template_tokens(len(seed.messages)) + len(await client.tokenize(text))

    return list(await asyncio.gather(*(count(seed) for seed in seeds)))


async def find_overlong(
    seeds: Sequence[SeedPrompt], client: LlamaClient, *, digest_tokens: int, limit: int
) -> list[tuple[SeedPrompt, int]]:
    """The seeds whose whole prompt is over `limit` tokens, each with its token count.

    The prompt is the digest (`digest_tokens`), the chat template, the seed's messages and the
    JSON schemas of the tools it offers;
    `limit` is what a slot holds for it (context per slot minus the answer budget). Only seeds
    whose byte bound does not fit cost a `/tokenize` call; the caller owns the client session.
    """

    def bound(seed: SeedPrompt) -> int:
        template = template_tokens(len(seed.messages)) + tools_template_tokens(seed)
        return digest_tokens + template + token_bound(seed)

    doubtful = [seed for seed in seeds if bound(seed) > limit]
    counts = await _prompt_tokens(client, doubtful)
    totals = [(seed, digest_tokens + count) for seed, count in zip(doubtful, counts, strict=True)]
    return [(seed, total) for seed, total in totals if total > limit]


def quarantine_overlong(
    seeds: Sequence[SeedPrompt],
    token_counts: Mapping[str, int],
    limit: int,
    *,
    now: datetime | None = None,
) -> InputBatch:
    """Split seeds by prompt length in tokens (`token_counts` by input id, from the server).

    `limit` is what fits: context per slot minus the digest and the answer budget. A seed
    without a count is a caller bug, so it raises instead of guessing.
    """
    missing = [seed.input_id for seed in seeds if seed.input_id not in token_counts]
    if missing:
        raise ValueError(f"no token count for input ids: {', '.join(missing[:5])}")
    created = now or datetime.now(UTC)
    kept: list[SeedPrompt] = []
    quarantined: list[QuarantineRow] = []
    for seed in seeds:
        count = token_counts[seed.input_id]
        if count <= limit:
            kept.append(seed)
            continue
        raw = raw_json([message.model_dump() for message in seed.messages])
        # A detail in parentheses: the export card names the reason without it.
        with_tools = " (the schemas of its tools included)" if seed.params.tools else ""
        quarantined.append(
            input_row(
                source_file=seed.source_file,
                line=seed.line,
                reason=f"prompt is {count} tokens, over the limit of {limit}{with_tools}",
                raw=raw,
                now=created,
                input_id=seed.input_id,
            )
        )
    return InputBatch(seeds=kept, quarantined=quarantined)


async def check_prompt_lengths(
    seeds: Sequence[SeedPrompt],
    client: LlamaClient,
    *,
    digest_tokens: int,
    limit: int,
    now: datetime | None = None,
) -> InputBatch:
    """`seeds` split into those that fit a slot and quarantine rows for the over-long ones."""
    overlong = dict(
        (seed.input_id, total)
        for seed, total in await find_overlong(
            seeds, client, digest_tokens=digest_tokens, limit=limit
        )
    )
    # A seed that fits needs no exact count for the split: the limit itself stands in for it.
    counts = {seed.input_id: overlong.get(seed.input_id, limit) for seed in seeds}
    return quarantine_overlong(seeds, counts, limit, now=now)
