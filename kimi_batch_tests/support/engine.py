"""Digests, questions and endpoints for engine tests on a real llama-server."""

from __future__ import annotations

import uuid

from kimi_batch.engine.batch_engine import Endpoint
from kimi_batch.engine.digest import SystemDigest, load_digest
from kimi_batch.engine.generation import GenerationRequest, SamplingParams
from kimi_batch.llama.messages import ChatMessage
from kimi_batch.llama.server import ResidentServer
from kimi_batch.settings import default_digest_path

__all__ = ["SHORT", "digest_tokens", "endpoint_of", "fresh_digest", "questions", "server_tasks"]

SHORT = SamplingParams(max_tokens=8, temperature=0.0)
_LETTERS = str.maketrans("0123456789", "ghijklmnop")


def fresh_digest(tag: str = "", *, sections: int | None = None) -> SystemDigest:
    """The shipped digest plus a unique closing line: a sha no slot or save file has seen.
    `sections`: only its first sections (`## ` headings), where a test asserts how a digest is
    reused, not how long one takes: every slot's prefill of the whole ~1.2k-token digest costs
    seconds on 2 cores."""
    base = load_digest(default_digest_path()).text
    if sections is not None:
        base = "\n## ".join(base.split("\n## ")[: sections + 1]).rstrip("\n") + "\n\n"
    marker = uuid.uuid4().hex[:8].replace("0", "o")  # letters keep the lint quiet about hex ids
    return SystemDigest.from_text(f"{base}Variant note {tag} {marker.translate(_LETTERS)}.\n")


async def digest_tokens(server: ResidentServer, digest: SystemDigest) -> int:
    """The digest's length in the server's own tokens."""
    async with server.client() as client:
        return len(await client.tokenize(digest.text))


def questions(n: int, prefix: str = "q") -> list[GenerationRequest]:
    """`n` short distinct questions with ids `{prefix}0..`."""
    return [
        GenerationRequest(
            input_id=f"{prefix}{i}",
            messages=[
                ChatMessage(role="user", content=f"{prefix}: name one use of the number {i}.")
            ],
            params=SHORT,
        )
        for i in range(n)
    ]


def endpoint_of(server: ResidentServer) -> Endpoint:
    """The engine's view of a resident server (its slots, per-slot context, save folder)."""
    return Endpoint(
        base_url=server.base_url,
        slots=server.spec.parallel,
        model=server.spec.model_alias,
        ctx=server.spec.ctx // server.spec.parallel,
        n_predict=server.spec.n_predict,
        slot_save_dir=server.spec.slot_save_path,
    )


def server_tasks(server: ResidentServer) -> int:
    """Completions the server processed, counted from its own log."""
    return server.log_path.read_text(errors="replace").count("launch_slot_: id")
