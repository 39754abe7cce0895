"""The memory check: GGUF shape, the estimate against a real server's RSS, refusal before spawn."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from kimi_batch.cli import main
from kimi_batch.llama.memory import (
    GIB,
    MIB,
    InsufficientMemoryError,
    ModelShape,
    check_memory,
    estimate_memory,
    read_model_shape,
)
from kimi_batch.llama.server import ResidentServer
from kimi_batch.settings import FlashAttention
from kimi_batch_tests.support.llama_server import make_spec
from kimi_batch_tests.support.ports import free_port

pytestmark = pytest.mark.slow  # a real llama-server


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_smollm2_shape_comes_from_the_gguf_header(model_path: Path) -> None:
    shape = read_model_shape(model_path)

    assert shape.architecture == "llama"
    assert shape.n_layer == 30
    assert shape.n_head == 9
    assert shape.n_head_kv == 3
    assert shape.key_length == shape.value_length == 64
    assert shape.kv_lora_rank is None
    assert shape.n_ctx_train == 8192  # what `-c 0` asks for
    assert shape.file_bytes == model_path.stat().st_size


# Kimi-K2 / DeepSeek-V3 shape: 61 layers, 64 heads of 192/128, latent 512 + rope 64.
KIMI = ModelShape(
    architecture="deepseek2",
    file_bytes=550 * GIB,
    n_layer=61,
    n_embd=7168,
    n_vocab=163840,
    n_head=64,
    n_head_kv=64,
    key_length=192,
    value_length=128,
    kv_lora_rank=512,
    rope_dim=64,
)


def test_mla_models_cache_the_compressed_latent_not_full_heads() -> None:
    estimate = estimate_memory(KIMI, ctx=65536, ubatch=512, cache_ram_mib=32768)

    # (512 + 64 + 512) f16 elements x 61 layers x 65536 cells: 8.1 GiB, not 155 GiB of full heads.
    assert estimate.kv_cache_bytes == pytest.approx(1088 * 2 * 61 * 65536, rel=1e-6)
    q8 = ["-ctk", "q8_0", "-ctv", "q8_0"]
    half = estimate_memory(KIMI, ctx=65536, ubatch=512, cache_ram_mib=0, extra_args=q8)
    assert half.kv_cache_bytes < 0.6 * estimate.kv_cache_bytes
    assert estimate.prompt_cache_bytes == 32 * GIB


def test_without_flash_attention_the_compute_buffer_holds_a_slots_attention_scores() -> None:
    def compute(flash_attn: FlashAttention | None, *extra: str) -> int:
        return estimate_memory(
            KIMI,
            ctx=65536,
            ubatch=512,
            cache_ram_mib=0,
            parallel=4,
            flash_attn=flash_attn,
            extra_args=extra,
        ).compute_bytes

    on = compute("on")
    # f32 scores of 64 heads x 512 tokens x a slot's 16384 cells: 2 GiB.
    assert compute("off") - on == 4 * 64 * 512 * 16384 == 2 * GIB
    assert compute(None) == compute("auto") == on  # the build's default: on for a CPU
    assert compute("on", "-fa", "off") == compute("off")  # the extra arguments come last
    assert compute("off", "--kv-unified") - on == 8 * GIB  # one stream over every cell
    assert compute("off", "-amb", "512") - on == 512 * MIB  # ik_llama.cpp's pieces


@pytest.mark.parametrize(("flash_attn", "parallel"), [("on", 1), ("off", 1), ("off", 4)])
def test_compute_estimate_covers_the_buffer_the_real_server_reserves(
    tmp_path: Path,
    llama_binary: Path,
    model_path: Path,
    flash_attn: FlashAttention,
    parallel: int,
) -> None:
    spec = make_spec(
        llama_binary, model_path, tmp_path, ctx=16384, parallel=parallel, flash_attn=flash_attn
    ).model_copy(update={"ubatch": 512, "cache_ram_mib": 0, "extra_args": ("-lv", "4")})
    server = ResidentServer(spec, tmp_path / "server", load_timeout_s=300)
    server.ensure_running()
    server.stop()
    # llama.cpp logs the compute buffer it reserved for the worst micro-batch (at -lv 4).
    reserved = re.findall(r"CPU compute buffer size = +([\d.]+) MiB", server.log_path.read_text())
    assert reserved, server.log_path.read_text()[-2000:]
    estimate = check_memory(
        model_path,
        ctx=spec.ctx,
        ubatch=spec.ubatch,
        cache_ram_mib=0,
        parallel=parallel,
        flash_attn=flash_attn,
    )

    assert estimate.compute_bytes >= float(reserved[-1]) * MIB, (estimate.describe(), reserved)
    assert estimate.compute_bytes <= 1.5 * float(reserved[-1]) * MIB + 32 * MIB


def test_estimate_is_within_20_percent_of_the_real_servers_rss(
    tmp_path: Path, llama_binary: Path, model_path: Path
) -> None:
    # No RAM prompt cache: it fills with use, and the estimate counts it separately.
    spec = make_spec(llama_binary, model_path, tmp_path).model_copy(update={"cache_ram_mib": 0})
    server = ResidentServer(spec, tmp_path / "server", load_timeout_s=300)
    handle = server.ensure_running()
    try:
        # One request touches the compute buffers as a batch run does.
        httpx.post(
            f"{handle.base_url}/completion",
            json={"prompt": "Hello " * 200, "n_predict": 4},
            timeout=120,
        ).raise_for_status()
        assert handle.pid is not None
        rss = _rss_bytes(handle.pid)
    finally:
        server.stop()
    estimate = check_memory(
        model_path,
        ctx=spec.ctx,
        ubatch=spec.ubatch,
        cache_ram_mib=0,
        parallel=spec.parallel,
        flash_attn=spec.flash_attn,
    )

    assert estimate.resident_bytes == pytest.approx(rss, rel=0.2), (estimate.describe(), rss)


def test_a_config_over_the_machines_memory_is_refused_before_spawning(
    tmp_path: Path, llama_binary: Path, model_path: Path
) -> None:
    # 4M cells of SmolLM2's KV cache are ~90 GiB, more than this machine (or CI) has.
    spec = make_spec(llama_binary, model_path, tmp_path).model_copy(update={"ctx": 4_000_000})
    server = ResidentServer(spec, tmp_path / "server")

    with pytest.raises(InsufficientMemoryError, match=r"KV cache \d+\.\d+ GiB.*GiB available"):
        server.ensure_running()
    assert not server.pid_path.exists()
    assert not server.log_path.exists()


def test_cli_names_the_numbers_in_one_line(
    tmp_path: Path,
    llama_binary: Path,
    model_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name, value in {
        "KIMI_BATCH_HOME": str(tmp_path),
        "KIMI_BATCH_MODEL": str(model_path),
        "KIMI_BATCH_LLAMA_SERVER": str(llama_binary),
        "KIMI_BATCH_LLAMA_CTX": "4000000",
        "KIMI_BATCH_LLAMA_CACHE_RAM": "1024",
        "KIMI_BATCH_LLAMA_PORT": str(free_port()),
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("KIMI_BATCH_LLAMA_URL", raising=False)

    assert main(["server", "start"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "would not fit in memory" in err
    assert "GiB available" in err
