"""pytest plugin: a real llama-server with the real SmolLM2 model, shared by the session.

Nothing here skips: a missing binary or model fails the run, because CI must exercise the real
services (`make test` installs them first). Every test that requests these fixtures is marked
`slow` (the conftest enforces it), so `make unit` never starts a server.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pytest

from kimi_batch.llama.binary import find_llama_server
from kimi_batch.llama.server import ResidentServer, ServerSpec
from kimi_batch.settings import FlashAttention, Settings, default_model_path
from kimi_batch_tests.support.ports import free_port

__all__ = [
    "TEST_CTX",
    "TEST_FLASH_ATTN",
    "TEST_N_PREDICT",
    "TEST_SLOTS",
    "LlamaEnv",
    "llama_binary",
    "llama_env",
    "make_spec",
    "model_path",
    "server_with_args",
    "shared_server",
    "tool_server",
]

# A chat template that renders tools (Qwen2.5's: the same <|im_start|> tokens as SmolLM2's).
TOOL_TEMPLATE = Path(__file__).resolve().parent / "tool_template.jinja"

# Small enough for 2 cores, big enough for the ~1.1k-token shipped digest plus a short answer in
# each of the 4 slots (llama.cpp splits the context between slots).
TEST_SLOTS = 4
TEST_CTX = 4 * 2048
TEST_N_PREDICT = 128
# The test servers decode without flash attention: on these 2-core CPUs llama.cpp's default (on)
# decoded SmolLM2 over the cached ~1.2k-token digest at 44 tok/s with 4 slots, off at 113
# (llama-batched-bench), and evaluated a request's short suffix 4x faster. `kimi-batch tune`
# measures the same choice on a deployment's machine, and the embedded default makes it too
# (`kimi_batch.llama.factory.flash_attention`); named here so that a test server started from
# a binary given by path, or a developer's shell that says otherwise, decodes the same way.
TEST_FLASH_ATTN: Final = "off"
# Servers started from the environment (a Dagster run's, a stack's) decode as the fixtures' do;
# `support/cli.py` runs the CLI without it, in the default configuration.
os.environ.setdefault("KIMI_BATCH_LLAMA_FLASH_ATTN", TEST_FLASH_ATTN)


@pytest.fixture(scope="session")
def llama_binary() -> Path:
    return find_llama_server(os.environ.get("KIMI_BATCH_LLAMA_SERVER"))


@pytest.fixture(scope="session")
def model_path() -> Path:
    path = default_model_path()
    assert path is not None, "SmolLM2 model missing: run `make setup`"
    assert path.is_file(), path
    return path


def make_spec(
    binary: Path,
    model: Path,
    home: Path,
    *,
    port: int | None = None,
    parallel: int = TEST_SLOTS,
    ctx: int = TEST_CTX,
    n_predict: int = TEST_N_PREDICT,
    threads: int = 2,
    flash_attn: FlashAttention | None = TEST_FLASH_ATTN,
) -> ServerSpec:
    """A spec for a test's own server: a free port, slot saves under `home`."""
    return ServerSpec(
        binary=binary,
        model=model,
        port=port or free_port(),
        threads=threads,
        ctx=ctx,
        parallel=parallel,
        n_predict=n_predict,
        cache_ram_mib=1024,
        slot_save_path=home / "slots",
        flash_attn=flash_attn,
    )


@dataclass(frozen=True)
class LlamaEnv:
    """A resident server started exactly as the Dagster resource would start it from env vars."""

    home: Path
    base_url: str
    slots: int
    server: ResidentServer


@pytest.fixture(scope="session")
def llama_env(
    tmp_path_factory: pytest.TempPathFactory, llama_binary: Path, model_path: Path
) -> Iterator[LlamaEnv]:
    """KIMI_BATCH_* variables for a temp state dir, and the resident server running for them."""
    home = tmp_path_factory.mktemp("kimi_home")
    port = free_port()
    variables = {
        "KIMI_BATCH_HOME": str(home),
        "KIMI_BATCH_MODEL": str(model_path),
        "KIMI_BATCH_LLAMA_SERVER": str(llama_binary),
        "KIMI_BATCH_LLAMA_PORT": str(port),
        "KIMI_BATCH_LLAMA_THREADS": "2",
        "KIMI_BATCH_LLAMA_CTX": str(TEST_CTX),
        "KIMI_BATCH_LLAMA_PARALLEL": str(TEST_SLOTS),
        "KIMI_BATCH_LLAMA_N_PREDICT": str(TEST_N_PREDICT),
        "KIMI_BATCH_LLAMA_FLASH_ATTN": TEST_FLASH_ATTN,
    }
    with pytest.MonkeyPatch.context() as patch:
        for name, value in variables.items():
            patch.setenv(name, value)
        for name in ("KIMI_BATCH_LLAMA_URL", "KIMI_BATCH_TRINO_HOST", "DAGSTER_HOME"):
            patch.delenv(name, raising=False)
        # Imported here, after the variables are set, as the resource does at run time.
        from kimi_batch.llama.factory import server_from_settings
        from kimi_batch.settings import Settings

        server = server_from_settings(Settings.from_env(), load_timeout_s=300)
        assert isinstance(server, ResidentServer)
        handle = server.ensure_running()
        try:
            yield LlamaEnv(home=home, base_url=handle.base_url, slots=handle.slots, server=server)
        finally:
            server.stop()


@pytest.fixture(scope="session")
def shared_server(llama_env: LlamaEnv) -> ResidentServer:
    """The session's resident server (4 slots, real SmolLM2)."""
    return llama_env.server


@contextmanager
def server_with_args(
    monkeypatch: pytest.MonkeyPatch, home: Path, extra_args: str
) -> Iterator[Settings]:
    """A resident server of the session's model (the `llama_env` variables) with `extra_args`,
    in state dir `home`, on a port of its own; the settings that find it."""
    from kimi_batch.llama.factory import server_from_settings

    monkeypatch.setenv("KIMI_BATCH_HOME", str(home))
    monkeypatch.setenv("KIMI_BATCH_LLAMA_PORT", str(free_port()))
    monkeypatch.setenv("KIMI_BATCH_LLAMA_EXTRA_ARGS", extra_args)
    settings = Settings.from_env()
    server = server_from_settings(settings, load_timeout_s=300)
    assert isinstance(server, ResidentServer)
    server.ensure_running()
    try:
        yield settings
    finally:
        server.stop()


@pytest.fixture
def tool_server(
    llama_env: LlamaEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Settings]:
    """A resident server of the same model with a chat template that renders tools
    (`TOOL_TEMPLATE`; SmolLM2's own renders none); the settings that find it."""
    del llama_env  # its variables (model, binary, threads, slots) are this server's too
    with server_with_args(
        monkeypatch, tmp_path / "home", f"--chat-template-file {TOOL_TEMPLATE}"
    ) as settings:
        yield settings
