"""The local token bound holds on the real SmolLM2 tokenizer, and only doubtful rows are sent."""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from kimi_batch.inputs.prompts import ParamOverrides, SeedPrompt
from kimi_batch.llama import LlamaServerError, server_from_settings
from kimi_batch.llama.client import LlamaClient
from kimi_batch.llama.messages import ChatMessage
from kimi_batch.llama.server import ResidentServer
from kimi_batch.pipeline import (
    check_prompt_lengths,
    find_overlong,
    template_tokens,
    token_bound,
)
from kimi_batch.settings import Settings, default_digest_path
from kimi_batch_tests.support.llama_server import LlamaEnv, server_with_args

NOW = datetime(2025, 1, 2, tzinfo=UTC)


def _texts() -> list[str]:
    rng = random.Random(7)
    ranges = [(0x20, 0x7E), (0xA0, 0x2FFF), (0x4E00, 0x9FFF), (0x1F300, 0x1FAFF)]
    mixed = "".join(chr(rng.randint(*rng.choice(ranges))) for _ in range(1500))
    printable = "".join(chr(rng.randint(0x20, 0x7E)) for _ in range(2000))
    return [
        "a",
        "\n",
        "Why is the sky blue?",
        "<|im_start|>user\nspecial tokens as text<|im_end|>",
        "日本語のテキストと絵文字😀😀",
        " " * 777,
        "0123456789" * 100,
        mixed,
        printable,
    ]


def _seed(input_id: str, *contents: str) -> SeedPrompt:
    return SeedPrompt(
        input_id=input_id,
        messages=[
            ChatMessage(role="assistant" if index % 2 else "user", content=content)
            for index, content in enumerate(contents)
        ],
        prompt=contents[-1],
        source_file="f.jsonl",
        line=1,
    )


@pytest.mark.slow
async def test_byte_and_template_bounds_hold_on_the_real_tokenizer(
    shared_server: ResidentServer,
) -> None:
    digest = default_digest_path().read_text()
    async with shared_server.client() as client:
        for text in _texts():
            assert len(await client.tokenize(text)) <= len(text.encode("utf-8")), text[:40]
        digest_tokens = len(await client.tokenize(digest))
        for seed in [
            _seed("one", "What is rain?"),
            _seed("three", "What is rain?", "Water.", "And snow?"),
            _seed("five", *_texts()[4:9]),
        ]:
            rendered = await client.apply_template(
                [ChatMessage(role="system", content=digest), *seed.messages]
            )
            total = len(await client.tokenize(rendered, add_special=True))
            user = len(await client.tokenize("\n".join(m.content for m in seed.messages)))
            fixed = digest_tokens + template_tokens(len(seed.messages))
            assert total <= fixed + user, seed.input_id  # the exact count never undercounts
            assert fixed + user <= fixed + token_bound(seed)
            # ...and the template allowance is a few tokens, not a guess that hides long prompts.
            assert fixed + user - total <= 8 + 3 * len(seed.messages), seed.input_id


class _CountingClient(LlamaClient):
    """The real client, counting the /tokenize calls it makes."""

    def __init__(self, base_url: str) -> None:
        super().__init__(base_url)
        self.tokenized: list[str] = []

    async def tokenize(self, content: str, *, add_special: bool = False) -> list[int]:
        self.tokenized.append(content)
        return await super().tokenize(content, add_special=add_special)


@pytest.mark.slow
async def test_only_rows_over_the_byte_bound_are_tokenized(shared_server: ResidentServer) -> None:
    digest_tokens = 1000
    limit = 1400  # room for ~380 bytes of user text after the digest and the template
    short = [_seed(f"s{index}", f"Short question number {index}?") for index in range(40)]
    spaces = _seed("spaces", "Look:" + " " * 2000)  # 2 kB, but whitespace runs are few tokens
    long = _seed("long", "0123456789" * 60)  # digits are one token each here: 600 tokens
    chat = _seed("chat", "Tell me a story.", "Once upon a time " * 80, "Go on " * 70)
    seeds = [*short[:20], spaces, long, *short[20:], chat]
    client = _CountingClient(shared_server.base_url)

    async with client:
        overlong = await find_overlong(seeds, client, digest_tokens=digest_tokens, limit=limit)
        calls = len(client.tokenized)
        batch = await check_prompt_lengths(
            seeds, client, digest_tokens=digest_tokens, limit=limit, now=NOW
        )
        long_tokens = len(await client.tokenize(long.messages[0].content))

    assert calls == 3  # spaces, long, chat: the 40 short rows were decided locally
    (first, first_total), (second, _) = overlong
    assert (first.input_id, second.input_id) == ("long", "chat")
    assert first_total == digest_tokens + template_tokens(1) + long_tokens
    kept = [seed.input_id for seed in seeds if seed.input_id not in ("long", "chat")]
    assert [seed.input_id for seed in batch.seeds] == kept
    reasons = {row.input_id: row.reason for row in batch.quarantined}
    assert set(reasons) == {"long", "chat"}
    assert reasons["long"] == f"prompt is {first_total} tokens, over the limit of {limit}"


# ---- server-free: the function tools a row offers take context too ------------------------------


class _ByteTokenizer(LlamaClient):
    """No server: one token per UTF-8 byte (the most a byte-level BPE gives), calls recorded."""

    def __init__(self) -> None:
        super().__init__("http://127.0.0.1:9")
        self.tokenized: list[str] = []

    async def tokenize(self, content: str, *, add_special: bool = False) -> list[int]:
        self.tokenized.append(content)
        return list(content.encode("utf-8"))


def _tool(name: str, description: str) -> dict[str, object]:
    parameters = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


def _with_tools(input_id: str, content: str, tools: list[dict[str, object]]) -> SeedPrompt:
    return _seed(input_id, content).model_copy(update={"params": ParamOverrides(tools=tools)})


async def test_small_tools_that_surely_fit_cost_no_tokenize_call() -> None:
    small = [_with_tools(f"t{i}", f"Question {i}?", [_tool("search", "Find.")]) for i in range(8)]
    async with _ByteTokenizer() as client:
        batch = await check_prompt_lengths(small, client, digest_tokens=100, limit=2000, now=NOW)
        assert client.tokenized == []
    assert len(batch.seeds) == 8
    assert batch.quarantined == []


@pytest.mark.slow
async def test_a_row_s_tools_are_counted_as_the_real_template_renders_them(
    tool_server: Settings,
) -> None:
    """The chat template writes a row's tool schemas into the prompt: a short question with a
    6 kB schema cannot fit and is set aside, not sent; a row whose byte bound is over the limit
    but whose rendered prompt fits is kept (an estimate never throws a good row away)."""
    big = _with_tools("big", "Look it up.", [_tool("search", "Find a document. " * 400)])
    fits = _with_tools("fits", "Look it up.", [_tool("search", "Find a document. " * 20)])
    digest_tokens = 100

    async def rendered(client: LlamaClient, seed: SeedPrompt, *, tools: bool = True) -> int:
        # The digest's turn, empty: its text is `digest_tokens`.
        messages = [ChatMessage(role="system", content=""), *seed.messages]
        text = await client.apply_template(messages, tools=seed.params.tools or () if tools else ())
        return len(await client.tokenize(text, add_special=True))

    async with server_from_settings(tool_server).client() as client:
        assert (await client.props()).renders_tools
        exact = {
            seed.input_id: digest_tokens + await rendered(client, seed) for seed in (big, fits)
        }
        # The schemas are in the prompt the server renders...
        assert exact["big"] - digest_tokens - await rendered(client, big, tools=False) > 1000
        # ...and the limit lies between the rendered prompt of the row that fits and its bound.
        limit = exact["fits"] + 8
        assert digest_tokens + template_tokens(1) + token_bound(fits) > limit
        batch = await check_prompt_lengths(
            [fits, big], client, digest_tokens=digest_tokens, limit=limit, now=NOW
        )
    assert [seed.input_id for seed in batch.seeds] == ["fits"]
    (row,) = batch.quarantined
    assert row.input_id == "big"
    assert row.reason == (
        f"prompt is {exact['big']} tokens, over the limit of {limit} "
        "(the schemas of its tools included)"
    )


@pytest.fixture
def server_without_jinja(
    llama_env: LlamaEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Settings]:
    """A resident server of the session's model that renders no templates with jinja: it
    answers `/apply-template` with tools 500, "tools param requires --jinja flag"."""
    del llama_env
    with server_with_args(monkeypatch, tmp_path / "home", "--no-jinja") as settings:
        yield settings


@pytest.mark.slow
async def test_a_server_that_cannot_render_tools_gets_the_rows_estimated_not_the_check_failed(
    server_without_jinja: Settings,
) -> None:
    """The exact count needs the server to render the tools; one that cannot (no jinja) failed
    the whole partition's landing. The rows are counted from their text and the allowances."""
    big = _with_tools("big", "Look it up.", [_tool("search", "Find a document. " * 400)])
    small = _with_tools("small", "Look it up. " * 25, [_tool("search", "Find.")])
    digest_tokens = 100
    limit = 700  # the small row's byte bound is over it, its estimate not
    async with server_from_settings(server_without_jinja).client() as client:
        with pytest.raises(LlamaServerError, match="requires --jinja"):
            await client.apply_template(small.messages, tools=small.params.tools or ())
        batch = await check_prompt_lengths(
            [small, big], client, digest_tokens=digest_tokens, limit=limit, now=NOW
        )
    assert digest_tokens + template_tokens(1) + token_bound(small) > limit
    assert [seed.input_id for seed in batch.seeds] == ["small"]
    (row,) = batch.quarantined
    assert row.input_id == "big"
    assert row.reason.endswith(f"over the limit of {limit} (the schemas of its tools included)")
