"""`DeploymentResource`: the base of every resource, holding the code location's one `Settings`."""

# No `from __future__ import annotations`: Dagster reads the `ResourceDependency` annotation
# of `deployment` when the class is made, and a string would not be one.

import dagster as dg
from pydantic import Field

from kimi_batch.settings import Settings


class DeploymentResource(dg.ConfigurableResource):
    """A resource of the deployment. Its `Settings` (KIMI_BATCH_*, read once per process by
    `kimi_batch.definitions`) is a resource dependency, so run config can never replace it."""

    deployment: dg.ResourceDependency[Settings] = Field(
        description="The deployment's settings (KIMI_BATCH_*), built once per process."
    )

    def settings(self) -> Settings:
        return self.deployment
