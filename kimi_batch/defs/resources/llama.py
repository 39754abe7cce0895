"""`LlamaServerResource`: the resident llama-server every run attaches to (and never stops)."""

import asyncio
from pathlib import Path

import dagster as dg
from pydantic import Field

from kimi_batch.defs.resources.deployment import DeploymentResource
from kimi_batch.engine import (
    DEFAULT_REMEDY,
    EnginePolicy,
    Prepared,
    SpeedStore,
    SystemDigest,
    prepare,
)
from kimi_batch.llama import (
    AttachedServer,
    LlamaClient,
    ResidentServer,
    ServerHandle,
    server_from_settings,
)

# Another run may have restarted the server for the same hang a moment ago: leave that one be.
HUNG_RESTART_MIN_AGE_S = 60.0


class LlamaServerResource(DeploymentResource):
    """Attach to the resident llama-server, starting it once if it is not running.

    Which server, binary, model, URL and API key is deployment configuration: the one `Settings`
    the code location was built with (`deployment`, a resource dependency that run config cannot
    set), never run config: a launchpad user must not be able to start another binary or send a
    key to another host. A run never stops the server, so the next run finds the
    model loaded and the digest in the slots.
    """

    load_timeout_s: float | None = Field(
        default=None,
        gt=0,
        description="Seconds to wait for a model load (default KIMI_BATCH_LLAMA_LOAD_TIMEOUT_S).",
    )

    def manager(self) -> ResidentServer | AttachedServer:
        return server_from_settings(self.settings(), load_timeout_s=self.load_timeout_s)

    def ensure_running(self) -> ServerHandle:
        """Attach or start; a server that died on its own (a signal, say) is named in the run log."""
        handle = self.manager().ensure_running()
        if handle.previous_exit:
            dg.get_dagster_logger().warning(
                f"the resident {handle.previous_exit}; it was started again"
            )
        return handle

    def client(self) -> LlamaClient:
        return self.manager().client()

    def urls(self, handle: ServerHandle) -> list[str]:
        """The attached (or started) server first, then the scale-out servers.

        An attach-only URL is taken from the settings, not the handle: only clients may see the
        credentials it can hold.
        """
        settings = self.settings()
        return [settings.llama_url or handle.base_url, *settings.llama_extra_urls]

    def known_n_predict(self) -> int:
        """The answer budget where /props reports none (llama.cpp's does not report
        --n-predict): the -n of the server we started, the default budget for an attached one."""
        return self.settings().llama_n_predict

    def speed_store(self) -> SpeedStore:
        """Where the speeds a batch or a digest prefill measures wait for the next one."""
        return SpeedStore(self.settings().paths.measured_speeds_path)

    def fit_remedy(self) -> str:
        """What to change when digest + prompt + answer do not fit a slot (`{ctx_needed}`)."""
        if self.settings().llama_url:
            return (
                "start the attached server (KIMI_BATCH_LLAMA_URL) with --ctx-size at least "
                "{ctx_needed}, or fewer --parallel slots"
            )
        return DEFAULT_REMEDY

    async def prepare(self, digest: SystemDigest) -> Prepared:
        """Start or attach (in a thread: a model load blocks), then describe every endpoint."""
        handle = await asyncio.to_thread(self.ensure_running)
        return await prepare(
            self.urls(handle),
            model=handle.model,
            digest=digest,
            api_key=self.settings().llama_api_key,
            known_n_predict=self.known_n_predict(),
            slot_save_dir=self.slot_save_dir(),
        )

    def slot_save_dir(self) -> Path | None:
        """The resident server's slot-save folder; None for an attached server (its folder is
        not this process's to clean up)."""
        settings = self.settings()
        return None if settings.llama_url else settings.paths.slot_save_dir

    def engine_policy(self) -> EnginePolicy:
        """How an engine batch runs here (the bound on a batch's own slot saves)."""
        return EnginePolicy(slot_saves_max=self.settings().slot_saves_max)

    def respawn_if_down(self, base_url: str) -> None:
        """Engine hook: after a connection error, bring the resident server back if it died."""
        manager = self.manager()
        if isinstance(manager, ResidentServer) and base_url.rstrip("/") == manager.base_url:
            self.ensure_running()

    def restart_hung(self, base_url: str) -> None:
        """Engine hook: the resident server stopped making progress; kill and respawn it."""
        manager = self.manager()
        if isinstance(manager, ResidentServer) and base_url.rstrip("/") == manager.base_url:
            manager.restart(min_age_s=HUNG_RESTART_MIN_AGE_S)
