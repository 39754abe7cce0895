"""`DigestResource`: the fixed system digest and which lint exceptions are allowed."""

# No `from __future__ import annotations`: Dagster reads the `ResourceDependency` annotation
# of `deployment` when the class is made, and a string would not be one.

import dagster as dg
from pydantic import Field

from kimi_batch.engine import DigestLintError, SystemDigest, lint_digest, load_digest
from kimi_batch.settings import Settings

__all__ = ["DigestResource"]


class DigestResource(dg.ConfigurableResource):
    """The system digest file (KIMI_BATCH_DIGEST); every request starts with its exact bytes.

    The file is deployment configuration, not run config: a run must not read arbitrary files
    into prompts (or into a lint error).
    """

    deployment: dg.ResourceDependency[Settings] = Field(
        description="The deployment's settings (KIMI_BATCH_*), built once per process."
    )
    allow_patterns: list[str] = Field(
        default_factory=list,
        description="Regexes of dynamic-looking text the lint should accept (e.g. a version).",
    )

    def load(self) -> SystemDigest:
        """The digest, refused when it holds cache-breaking dynamic content."""
        digest = load_digest(self.deployment.digest)
        findings = lint_digest(digest.text, allow=self.allow_patterns)
        if findings:
            raise DigestLintError(digest.path, findings)
        return digest
