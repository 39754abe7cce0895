"""Will the server fit? Weights + KV cache + compute buffers + RAM prompt cache vs available RAM.

On the target the model alone is ~550 GiB of a 768 GiB machine; a context or slot count too large
for the rest is found by the kernel's OOM killer minutes into the load, after the page cache was
filled for nothing. So the spec is sized from the GGUF metadata before the server is spawned and
refused with the numbers when it cannot fit.

KV cache per token and layer: `head_count_kv x (key_length + value_length)` elements, or for MLA
models (deepseek2 family: Kimi-K2, DeepSeek-V3, where `attention.kv_lora_rank` is set) the
compressed latent `kv_lora_rank + rope dimension` for K plus `kv_lora_rank` for V (what
llama.cpp allocates; ik_llama.cpp's -mla 3 stores less, so this errs on the safe side).

Without flash attention the compute buffer also holds a micro-batch's attention scores: f32 for
every head, token and cached cell of its slot (`4 x heads x ubatch x ctx / slots` bytes; measured
here with SmolLM2 at 16k cells: 327.5 MiB reserved off against 30.6 on). ik_llama.cpp cuts it
into pieces of at most `-amb` MiB, so that flag, when given, caps it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kimi_batch.llama.exceptions import ServerSpawnError
from kimi_batch.llama.flags import count_flag, flag_value, last_switch
from kimi_batch.settings import FlashAttention

MIB = 1024 * 1024
GIB = 1024 * MIB
# Bytes per element of llama.cpp's KV cache types (block size included for the quantized ones).
CACHE_TYPE_BYTES = {
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "q8_0": 34 / 32,
    "q5_1": 24 / 32,
    "q5_0": 22 / 32,
    "q4_1": 20 / 32,
    "q4_0": 18 / 32,
    "iq4_nl": 18 / 32,
}
# Process, libraries, HTTP server and per-slot state (llama-server on CPU, SmolLM2: RSS minus
# weights and KV cache was ~39 MiB with 4 slots).
BASE_OVERHEAD_BYTES = 32 * MIB
# f32 activations of one micro-batch, a few live tensors of n_embd per token.
_ACTIVATION_TENSORS = 8
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")
# The attention scores' element: f32.
_SCORE_BYTES = 4


class InsufficientMemoryError(ServerSpawnError):
    """The configured server would not fit in the memory available."""


class ModelShape(BaseModel):
    """What the memory estimate needs from a GGUF header."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    architecture: str
    file_bytes: int = Field(ge=0, description="All shards of a split model.")
    n_layer: int = Field(ge=1)
    n_embd: int = Field(ge=1)
    n_vocab: int = Field(ge=1)
    n_head: int = Field(ge=1, description="Attention (query) heads.")
    n_head_kv: int = Field(ge=0, description="Largest per-layer KV head count.")
    key_length: int = Field(ge=0)
    value_length: int = Field(ge=0)
    kv_lora_rank: int | None = Field(default=None, description="Set for MLA models.")
    rope_dim: int = 0
    n_ctx_train: int | None = Field(
        default=None, ge=1, description="The context it was trained for: what `-c 0` asks for."
    )

    def kv_elements_per_token(self) -> int:
        """Elements of K and V cached per token over all layers."""
        if self.kv_lora_rank:
            per_layer = (self.kv_lora_rank + self.rope_dim) + self.kv_lora_rank
        else:
            per_layer = self.n_head_kv * (self.key_length + self.value_length)
        return per_layer * self.n_layer


class MemoryEstimate(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    weights_bytes: int
    kv_cache_bytes: int
    compute_bytes: int
    prompt_cache_bytes: int
    prompt_cache_unbounded: bool = Field(
        default=False, description="`--cache-ram -1`: no cap, so no number to count."
    )
    available_bytes: int | None

    @property
    def resident_bytes(self) -> int:
        """What the server holds once loaded and serving (the prompt cache grows later)."""
        return self.weights_bytes + self.kv_cache_bytes + self.compute_bytes

    @property
    def required_bytes(self) -> int:
        return self.resident_bytes + self.prompt_cache_bytes

    def describe(self) -> str:
        cache = (
            "unbounded (-1), not counted"
            if self.prompt_cache_unbounded
            else f"{self.prompt_cache_bytes / GIB:.2f} GiB"
        )
        parts = (
            f"weights {self.weights_bytes / GIB:.2f} GiB + KV cache {self.kv_cache_bytes / GIB:.2f}"
            f" GiB + compute {self.compute_bytes / GIB:.2f} GiB + prompt cache (--cache-ram) "
            f"{cache} = {self.required_bytes / GIB:.2f} GiB"
        )
        if self.available_bytes is None:
            return parts
        return f"{parts}; {self.available_bytes / GIB:.2f} GiB available"


def _shards(model: Path) -> list[Path]:
    found = _SPLIT.search(model.name)
    if not found:
        return [model]
    count = int(found.group(2))
    stem = model.name[: found.start()]
    return [model.with_name(f"{stem}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]


def _field(fields: dict[str, Any], key: str) -> Any:
    field = fields.get(key)
    return None if field is None else field.contents()


def read_model_shape(model: Path) -> ModelShape:
    """The shape of a model from its GGUF header (the tensors are not read)."""
    from gguf import GGUFReader  # a large import; only spawns need it

    try:
        reader = GGUFReader(model)
    except (OSError, ValueError, IndexError, KeyError, TypeError) as error:
        raise ServerSpawnError(f"{model} is not a readable GGUF file: {error}") from error
    fields = dict(reader.fields)
    arch = str(_field(fields, "general.architecture"))

    def number(name: str, default: int | None = None) -> int | None:
        key = f"{arch}.{name}"
        value = _field(fields, key)
        if isinstance(value, list):  # per-layer values (e.g. head_count_kv of hybrid models)
            value = max((_whole(item, key, model) for item in value), default=None)
        return _whole(value, key, model) if value is not None else default

    n_embd = number("embedding_length") or 1
    n_head = number("attention.head_count") or 1
    tokens = _field(fields, "tokenizer.ggml.tokens")
    vocab = len(tokens) if isinstance(tokens, list) else number("vocab_size", 32000)
    try:
        return _shape(model, arch, number, vocab, n_embd, n_head)
    except ValidationError as error:
        raise ServerSpawnError(f"{model}: GGUF metadata out of range: {error}") from error


def _whole(value: Any, key: str, model: Path) -> int:
    """A metadata number as an int: a text, a truth value, NaN or a fraction where a count
    belongs is a clear ServerSpawnError naming the key (it was a raw ValueError, or read as 1)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ServerSpawnError(f"{model}: GGUF key {key} is {value!r}, not a whole number")
    if isinstance(value, float) and not value.is_integer():
        raise ServerSpawnError(f"{model}: GGUF key {key} is {value!r}, not a whole number")
    return int(value)


def _shape(
    model: Path,
    arch: str,
    number: Callable[..., int | None],
    vocab: int | None,
    n_embd: int,
    n_head: int,
) -> ModelShape:
    head_dim = n_embd // n_head
    return ModelShape(
        architecture=arch,
        file_bytes=sum(path.stat().st_size for path in _shards(model) if path.exists()),
        n_layer=number("block_count") or 1,
        n_embd=n_embd,
        n_vocab=vocab or 32000,
        n_head=n_head,
        n_head_kv=number("attention.head_count_kv", n_head) or 0,
        key_length=number("attention.key_length", head_dim) or 0,
        value_length=number("attention.value_length", head_dim) or 0,
        kv_lora_rank=number("attention.kv_lora_rank"),
        rope_dim=number("rope.dimension_count", 0) or 0,
        n_ctx_train=number("context_length") or None,
    )


def _attention_scores_bytes(
    shape: ModelShape,
    *,
    ctx: int,
    ubatch: int,
    parallel: int,
    flash_attn: FlashAttention | None,
    args: Sequence[str],
) -> int:
    """A micro-batch's attention scores without flash attention (none with it, or unset: the
    build's default is on for a CPU). The extra arguments come last on the command line, so
    their flag wins."""
    if (flag_value(args, ("-fa", "--flash-attn")) or flash_attn) != "off":
        return 0
    unified = last_switch(args, ("-kvu", "--kv-unified"), ("-no-kvu", "--no-kv-unified"))
    cells = ctx if unified else math.ceil(ctx / parallel)
    scores = _SCORE_BYTES * shape.n_head * ubatch * cells
    cap_mib = flag_value(args, ("-amb", "--attention-max-batch"))  # ik_llama.cpp's pieces
    if cap_mib is not None and cap_mib.isascii() and cap_mib.isdigit() and int(cap_mib) > 0:
        scores = min(scores, int(cap_mib) * MIB)
    return scores


def estimate_memory(
    shape: ModelShape,
    *,
    ctx: int,
    ubatch: int,
    cache_ram_mib: int | None,
    parallel: int = 1,
    flash_attn: FlashAttention | None = None,
    extra_args: Sequence[str] = (),
    available_bytes: int | None = None,
) -> MemoryEstimate:
    """Bytes the server needs for this shape and configuration.

    The KV cache holds `ctx` cells in total (llama.cpp splits them between the `parallel`
    slots); the compute buffers scale with the micro-batch (its activations and, without flash
    attention, its attention scores over a slot's cells).
    """
    # The extra arguments come last on the command line: a context, slot count, micro-batch or
    # prompt cache they set is the server's (they were ignored here, so `-c 131072` in
    # KIMI_BATCH_LLAMA_EXTRA_ARGS passed the check with the settings' context). `-c 0` is the
    # model's own context (its GGUF header's; it was estimated as the spec's, so `-c 0` on a
    # model trained for 256k passed the check at the settings' 16k), the spec's for a header
    # without one; `-np -1` (auto) is not known here: the spec's count stands.
    ctx = count_flag(extra_args, ("-c", "--ctx-size"), ctx, 0) or shape.n_ctx_train or ctx
    parallel = count_flag(extra_args, ("-np", "--parallel"), parallel, 1)
    ubatch = count_flag(extra_args, ("-ub", "--ubatch-size"), ubatch, 1)
    cache_ram_mib = count_flag(extra_args, ("-cram", "--cache-ram"), cache_ram_mib or 0, 0)
    # `-1` is llama-server's "no limit": the cache grows with the prompts it keeps, so there is
    # no number to check; the line says so (it was counted at the settings' cap).
    unbounded = flag_value(extra_args, ("-cram", "--cache-ram")) == "-1"
    type_k = (flag_value(extra_args, ("-ctk", "--cache-type-k")) or "f16").lower()
    type_v = (flag_value(extra_args, ("-ctv", "--cache-type-v")) or "f16").lower()
    elements = shape.kv_elements_per_token()
    # Split the elements between K and V by their share to apply each type's width.
    if shape.kv_lora_rank:
        k_share = (shape.kv_lora_rank + shape.rope_dim) / (2 * shape.kv_lora_rank + shape.rope_dim)
    else:
        total = shape.key_length + shape.value_length
        k_share = shape.key_length / total if total else 0.5
    per_token = elements * (
        k_share * CACHE_TYPE_BYTES.get(type_k, 2.0)
        + (1 - k_share) * CACHE_TYPE_BYTES.get(type_v, 2.0)
    )
    compute = BASE_OVERHEAD_BYTES + 4 * ubatch * shape.n_embd * _ACTIVATION_TENSORS
    compute += _attention_scores_bytes(
        shape, ctx=ctx, ubatch=ubatch, parallel=parallel, flash_attn=flash_attn, args=extra_args
    )
    return MemoryEstimate(
        weights_bytes=shape.file_bytes,
        kv_cache_bytes=math.ceil(per_token * ctx),
        compute_bytes=compute,
        prompt_cache_bytes=0 if unbounded else (cache_ram_mib or 0) * MIB,
        prompt_cache_unbounded=unbounded,
        available_bytes=available_bytes,
    )


def available_memory_bytes() -> int | None:
    """MemAvailable, lowered to the cgroup's memory limit when one is set."""
    available: int | None = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    except OSError:
        return None
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            raw = Path(limit_file).read_text().strip()
        except OSError:
            continue
        if raw.isascii() and raw.isdigit() and available is not None and int(raw) < available:
            available = int(raw)
    return available


def check_memory(
    model: Path,
    *,
    ctx: int,
    ubatch: int,
    cache_ram_mib: int | None,
    parallel: int = 1,
    flash_attn: FlashAttention | None = None,
    extra_args: Sequence[str] = (),
    available_bytes: int | None = None,
) -> MemoryEstimate:
    """Estimate, and raise InsufficientMemoryError when it exceeds what is available."""
    if available_bytes is None:
        available_bytes = available_memory_bytes()
    estimate = estimate_memory(
        read_model_shape(model),
        ctx=ctx,
        ubatch=ubatch,
        cache_ram_mib=cache_ram_mib,
        parallel=parallel,
        flash_attn=flash_attn,
        extra_args=extra_args,
        available_bytes=available_bytes,
    )
    if available_bytes is not None and estimate.required_bytes > available_bytes:
        raise InsufficientMemoryError(
            f"llama-server would not fit in memory: {estimate.describe()}. Lower "
            "KIMI_BATCH_LLAMA_CTX, KIMI_BATCH_LLAMA_CACHE_RAM or the slot count, or use a smaller "
            "quantization."
        )
    return estimate
