"""The stand-in's text: its tokenizer, the chat template it renders, its deterministic answers."""

from __future__ import annotations

import hashlib
import re
import zlib
from typing import Any

__all__ = ["answer_text", "common_prefix", "render_chat", "standin_tokens"]

_TOKEN = re.compile(r"\s?\w{1,6}|\s+|[^\w\s]")
_WORDS = (
    "the", "model", "answer", "data", "batch", "night", "slot", "token", "cache", "value",
    "first", "then", "each", "which", "result", "given", "list", "return", "check", "input",
)  # fmt: skip


def standin_tokens(text: str) -> list[int]:
    """The stand-in's tokenizer: prefix-stable pieces (a word up to 6 letters, a space, a sign)."""
    return [zlib.crc32(piece.encode()) for piece in _TOKEN.findall(text)]


def render_chat(messages: list[dict[str, Any]]) -> str:
    """ChatML, as the SmolLM2 template renders it (the digest first, so it is a shared prefix)."""
    parts = [
        f"<|im_start|>{m.get('role', 'user')}\n{m.get('content') or ''}<|im_end|>\n"
        for m in messages
    ]
    return "".join(parts) + "<|im_start|>assistant\n"


def answer_text(prompt: str, tokens: int) -> str:
    """`tokens` words chosen by a hash of the prompt: the same prompt, the same answer."""
    digest = hashlib.sha256(prompt.encode()).digest()
    return "".join(" " + _WORDS[(digest[i % 32] + i) % len(_WORDS)] for i in range(tokens))


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
