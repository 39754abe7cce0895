"""The code location's resources: the resident llama-server, the system digest, the warehouse and
the Trino reading it. Each is a `DeploymentResource` over the location's one `Settings`, so where
state lives and which server runs is deployment configuration, never run config.
"""

# No `from __future__ import annotations`: Dagster reads the `ResourceDependency` annotation
# of `deployment` when the class is made, and a string would not be one.

import dagster as dg
from pydantic import Field

from kimi_batch.engine import (
    DigestLintError,
    Ledger,
    LlamaDeployment,
    SystemDigest,
    lint_digest,
    load_digest,
)
from kimi_batch.inputs import Landing
from kimi_batch.paths import StatePaths
from kimi_batch.quality import QualityGate
from kimi_batch.settings import Settings
from kimi_batch.warehouse import Warehouse, open_warehouse


class DeploymentResource(dg.ConfigurableResource):
    """A resource of the deployment. Its `Settings` (KIMI_BATCH_*, read once per process by
    `kimi_batch.definitions`) is a resource dependency, so run config can never replace it."""

    deployment: dg.ResourceDependency[Settings] = Field(
        description="The deployment's settings (KIMI_BATCH_*), built once per process."
    )

    def settings(self) -> Settings:
        return self.deployment


def _warn(message: str) -> None:
    dg.get_dagster_logger().warning(message)


class LlamaServerResource(DeploymentResource):
    """The deployment's resident server (`engine.LlamaDeployment`), attached, or started once,
    and never stopped by a run. Which server is the one `Settings` the code location was built
    with, never run config."""

    load_timeout_s: float | None = Field(
        default=None,
        gt=0,
        description="Seconds to wait for a model load (default KIMI_BATCH_LLAMA_LOAD_TIMEOUT_S).",
    )

    def server(self) -> LlamaDeployment:
        """The server, a death it recovered from (a signal, say) named in the run's log."""
        return LlamaDeployment(self.settings(), load_timeout_s=self.load_timeout_s, warn=_warn)


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


class WarehouseResource(DeploymentResource):
    """Where a partition's inputs, finished requests and tables live (`Settings.paths`).

    Locations are deployment configuration (KIMI_BATCH_HOME, KIMI_BATCH_WAREHOUSE), so the
    sensor, the schedule and every run see the same state directory.
    """

    def paths(self) -> StatePaths:
        return self.deployment.paths

    def warehouse(self) -> Warehouse:
        return open_warehouse(self.deployment)

    def ledger(self) -> Ledger:
        return Ledger(self.paths().ledger_state)

    def landing(self) -> Landing:
        return Landing(self.paths())

    def quality_gate(self) -> QualityGate:
        """The gate the quality-gated stages' rows pass as they land (KIMI_BATCH_DEDUP_*,
        KIMI_BATCH_BENCHMARKS)."""
        return QualityGate(self.deployment, self.paths().dedup_state)


class TrinoResource(DeploymentResource):
    """A Trino coordinator with an Iceberg catalog over the warehouse (`kimi-batch publish`):
    nothing is published to it, it reads the tables' catalog and sees each commit on its next
    query. Host, user and password are deployment configuration (`KIMI_BATCH_TRINO_*`), never run
    config: a run must not be able to send the password to another host.
    """

    @property
    def enabled(self) -> bool:
        return bool(self.settings().trino_host)

    def table_name(self, table: str) -> str:
        """The table as Trino names it (materialization metadata)."""
        settings = self.settings()
        return f"{settings.trino_catalog}.{settings.trino_schema}.{table}"
