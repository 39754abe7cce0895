"""The one place where prompts are assembled: the digest is always the exact system prefix."""

from __future__ import annotations

from collections.abc import Sequence

from kimi_batch.engine.digest import SystemDigest
from kimi_batch.llama import ChatMessage

# The prefill request needs a user turn for the chat template; it is kept short because only the
# system part is shared with real requests.
WARMUP_USER_MESSAGE = "Ready."
# A row-level system prompt is folded into the first user message between these markers: the
# fixed digest must stay the only system prefix (any byte before it breaks the prompt cache).
INSTRUCTIONS_OPEN = "<instructions>"
INSTRUCTIONS_CLOSE = "</instructions>"


def assemble_messages(digest: SystemDigest, messages: Sequence[ChatMessage]) -> list[ChatMessage]:
    """[system: digest] + the request's user-side messages (no system turn for an empty digest:
    a Batch API request without a system message is sent without one).

    Anything variable (RAG context, the row's data, per-row instructions) must already be in
    `messages`; a system message there would land after the digest and is refused.
    """
    if any(message.role == "system" for message in messages):
        raise ValueError("request messages must not contain a system message: the digest is it")
    head = [ChatMessage(role="system", content=digest.text)] if digest.text else []
    return [*head, *messages]


def warmup_messages(digest: SystemDigest) -> list[ChatMessage]:
    return assemble_messages(digest, [ChatMessage(role="user", content=WARMUP_USER_MESSAGE)])


def fold_instructions(instructions: str | None, content: str) -> str:
    """Put a row's own system text in front of a user message as a clearly marked block."""
    if not instructions or not instructions.strip():
        return content
    return f"{INSTRUCTIONS_OPEN}\n{instructions.strip()}\n{INSTRUCTIONS_CLOSE}\n\n{content}"
