"""`LlamaServerResource`: the resident llama-server every run attaches to (and never stops)."""

import dagster as dg
from pydantic import Field

from kimi_batch.defs.resources.deployment import DeploymentResource
from kimi_batch.engine import Prepared, SystemDigest
from kimi_batch.llama import AttachedServer, ResidentServer, ServerHandle
from kimi_batch.pipeline import LlamaDeployment


def _warn(message: str) -> None:
    dg.get_dagster_logger().warning(message)


class LlamaServerResource(DeploymentResource):
    """The deployment's resident server (`pipeline.LlamaDeployment`), attached, or started once.

    Which server is the one `Settings` the code location was built with (`deployment`, a
    resource dependency that run config cannot set), never run config.
    """

    load_timeout_s: float | None = Field(
        default=None,
        gt=0,
        description="Seconds to wait for a model load (default KIMI_BATCH_LLAMA_LOAD_TIMEOUT_S).",
    )

    def server(self) -> LlamaDeployment:
        """The server, a death it recovered from named in the run's log."""
        return LlamaDeployment(self.settings(), load_timeout_s=self.load_timeout_s, warn=_warn)

    def manager(self) -> ResidentServer | AttachedServer:
        return self.server().manager()

    def ensure_running(self) -> ServerHandle:
        """Attach or start; a server that died on its own (a signal, say) is named in the run log."""
        return self.server().ensure_running()

    async def prepare(self, digest: SystemDigest) -> Prepared:
        """Start or attach, then describe every endpoint."""
        return await self.server().prepare(digest)
