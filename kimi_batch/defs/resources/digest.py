"""`DigestResource`: the fixed system digest and which lint exceptions are allowed."""

from pydantic import Field

from kimi_batch.defs.resources.deployment import DeploymentResource
from kimi_batch.engine import DigestLintError, SystemDigest, lint_digest, load_digest


class DigestResource(DeploymentResource):
    """The system digest file (KIMI_BATCH_DIGEST); every request starts with its exact bytes.

    The file is deployment configuration, not run config: a run must not read arbitrary files
    into prompts (or into a lint error).
    """

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
