"""`DigestResource`: where the fixed system digest lives and which lint exceptions are allowed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import dagster as dg
from pydantic import Field

from kimi_batch.engine.digest import DigestLintError, SystemDigest, lint_digest, load_digest
from kimi_batch.llama.client import LlamaClient
from kimi_batch.settings import Settings

__all__ = ["DigestResource"]


class DigestResource(dg.ConfigurableResource):
    """The system digest file; every request starts with its exact bytes."""

    path: str = Field(description="Digest file (KIMI_BATCH_DIGEST; default: the shipped one).")
    allow_patterns: list[str] = Field(
        default_factory=list,
        description="Regexes of dynamic-looking text the lint should accept (e.g. a version).",
    )

    @classmethod
    def from_settings(cls, settings: Settings) -> DigestResource:
        return cls(path=str(settings.digest))

    def load(self) -> SystemDigest:
        """The digest, refused when it holds cache-breaking dynamic content."""
        digest = load_digest(Path(self.path))
        findings = lint_digest(digest.text, allow=self.allow_patterns)
        if findings:
            raise DigestLintError(digest.path, findings)
        return digest

    def count_tokens(self, digest: SystemDigest, client: LlamaClient) -> int:
        return len(asyncio.run(_tokenize(client, digest.text)))


async def _tokenize(client: LlamaClient, text: str) -> list[int]:
    async with client:
        return await client.tokenize(text)
