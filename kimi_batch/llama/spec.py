"""What runs: a llama-server spec and its argv, and what a caller gets back (handle, status)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.llama.flags import count_flag
from kimi_batch.settings import FlashAttention

# The resident server's logger: a clamped thread count is a fact about the server it starts.
logger = logging.getLogger("kimi_batch.llama.server")


def available_cpus() -> int:
    """CPUs this process may run on (affinity and cgroup pinning included where visible)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class ServerSpec(BaseModel):
    """How to run llama-server. Defaults follow the source documents' batch settings."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    binary: Path = Field(description="llama-server (or ik_llama.cpp) executable.")
    model: Path = Field(description="GGUF file (first shard of a split model).")
    alias: str | None = Field(default=None, description="Model name reported; default file stem.")
    host: str = "127.0.0.1"
    port: int = Field(default=8081, gt=0, lt=65536)
    threads: int = Field(
        default=13, gt=0, description="Decode threads; 13 of 16 cores measured best."
    )
    threads_batch: int | None = Field(default=None, gt=0, description="Prefill threads.")
    cpus: frozenset[int] | None = Field(
        default=None, description="CPUs the server is pinned to; its threads fit the set."
    )
    ctx: int = Field(default=16384, ge=512, description="Total context, shared by the slots.")
    parallel: int = Field(default=4, ge=1, le=64, description="Slots (requests in flight).")
    batch: int = Field(default=2048, ge=32)
    ubatch: int = Field(default=256, ge=32)
    cache_ram_mib: int | None = Field(
        default=8192, ge=0, description="RAM prompt cache; None omits the flag (older builds)."
    )
    n_predict: int = Field(
        default=1024, gt=0, description="Server cap; requests are clamped to it."
    )
    slot_save_path: Path = Field(description="Directory of slot KV saves (the digest file).")
    metrics: bool = True
    spec_type: str | None = Field(
        default=None, description="--spec-type: speculative decoding (ngram-simple, draft...)."
    )
    draft_model: Path | None = Field(default=None, description="--model-draft GGUF.")
    flash_attn: FlashAttention | None = Field(
        default=None,
        description="--flash-attn (llama.cpp, and ik_llama.cpp since late 2025); None omits "
        "it: the build's default (older builds' -fa takes no value: give it in extra_args).",
    )
    extra_args: tuple[str, ...] = Field(
        default=(), description="Passed through untouched, e.g. ik_llama.cpp's -mla 3 -amb 512."
    )

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def model_alias(self) -> str:
        return self.alias or self.model.name.removesuffix(".gguf")

    @property
    def slots(self) -> int:
        """The slots the server runs: a `-np` in the extra arguments overrides `parallel`
        (they come last on the command line; `-np -1`, auto, is not known here)."""
        return count_flag(self.extra_args, ("-np", "--parallel"), self.parallel, 1)

    def effective_threads(self, cpus: int | None = None) -> tuple[int, int]:
        """(threads, threads_batch) clamped to the CPUs available; silent (status asks it too)."""
        cpus = cpus or (len(self.cpus) if self.cpus else available_cpus())
        threads = min(self.threads, cpus)
        return threads, min(self.threads_batch or threads, cpus)

    def argv(self, *, cpus: int | None = None) -> list[str]:
        """The command line that starts this server; warns once when the threads are clamped.

        Only a start builds it, so the warning reaches the commands that start a server and no
        other (`status` and `--help` read the settings too).
        """
        threads, threads_batch = self.effective_threads(cpus)
        if threads < self.threads and not self.cpus:  # pinned: the threads fit the set
            logger.warning(
                "threads=%d exceeds the %d CPUs available: clamped to %d (oversubscribed "
                "threads make decode thrash)",
                self.threads,
                threads,
                threads,
            )
        args = [
            str(self.binary),
            "--model", str(self.model),
            "--alias", self.model_alias,
            "--host", self.host,
            "--port", str(self.port),
            "--threads", str(threads),
            "--threads-batch", str(threads_batch),
            "--ctx-size", str(self.ctx),
            "--parallel", str(self.parallel),
            "--batch-size", str(self.batch),
            "--ubatch-size", str(self.ubatch),
            "--n-predict", str(self.n_predict),
            "--slot-save-path", str(self.slot_save_path),
        ]  # fmt: skip
        if self.cache_ram_mib is not None:
            args += ["--cache-ram", str(self.cache_ram_mib)]
        if self.flash_attn is not None:
            args += ["--flash-attn", self.flash_attn]
        if self.metrics:
            args.append("--metrics")
        if self.spec_type is not None:
            args += ["--spec-type", self.spec_type]
        if self.draft_model is not None:
            args += ["--model-draft", str(self.draft_model)]
        return args + list(self.extra_args)

    def describe(self) -> str:
        return (
            f"model={self.model} ctx={self.ctx} slots={self.slots} threads={self.threads} "
            f"n_predict={self.n_predict} port={self.port} spec={self.spec_type or '-'} "
            f"flash_attn={self.flash_attn or 'default'} extra={' '.join(self.extra_args) or '-'}"
        )


class ServerHandle(BaseModel):
    """A healthy server this process may use."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_url: str
    pid: int | None = Field(description="None for a server someone else runs.")
    spawned: bool = Field(description="True when this call started it (a model load happened).")
    slots: int
    model: str
    previous_exit: str | None = Field(
        default=None,
        description="How the server this state dir ran before ended, when it died on its own.",
    )


class ServerStatus(BaseModel):
    """What `kimi-batch server status --json` prints."""

    model_config = ConfigDict(extra="forbid")

    running: bool
    healthy: bool
    pid: int | None
    base_url: str
    model: str | None
    threads: int | None
    slots: int | None
    managed: bool = Field(description="Started by kimi_batch (pid file) rather than attached.")
    log_path: str | None
    started_at: float | None = Field(
        default=None, description="Unix time the managed server was spawned."
    )
