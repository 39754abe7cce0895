"""Properties of the llama-server command line and the memory check that sizes it, server-free.

- `ServerSpec.argv`: for any extra arguments, the spec's own flags come once each, the extra
  arguments after them untouched; `effective_threads` stays within the threads and the CPUs.
- The estimate reads a flag the way llama-server does (llama.cpp's parser, checked against the
  bundled binary's `--help`: short and long names, `_` for `-` in a long name, the last
  occurrence wins), so extra arguments that repeat a spec flag (`-c`, `-np`, `-ub`, `-cram`) are
  estimated with the value the server will use.
- The estimate is never negative, grows with the context and the micro-batch, and does not grow
  with the slots (each slot's attention scores cover fewer cells).
- `read_model_shape` on a GGUF written with the `gguf` library reads back the counts written;
  a text, a truth value or a fraction where a count belongs is a `ServerSpawnError` naming the
  key, never a raw ValueError.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

import gguf
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kimi_batch.llama import ServerSpawnError, ServerSpec
from kimi_batch.llama.memory import ModelShape, estimate_memory, read_model_shape

EXAMPLES = settings(max_examples=150, deadline=None)
FILE_EXAMPLES = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

SHAPE = ModelShape(
    architecture="llama",
    file_bytes=10**9,
    n_layer=30,
    n_embd=576,
    n_vocab=49152,
    n_head=9,
    n_head_kv=3,
    key_length=64,
    value_length=64,
)
# llama-server's spellings of the flags the estimate reads (`llama-server --help`).
SPELLINGS = {
    "ctx": ("-c", "--ctx-size", "--ctx_size"),
    "parallel": ("-np", "--parallel"),
    "ubatch": ("-ub", "--ubatch-size", "--ubatch_size"),
    "cache_ram_mib": ("-cram", "--cache-ram", "--cache_ram"),
}
# Flags the spec does not set, with a value or none, to stand between the ones it does.
OTHER = st.sampled_from([["--no-mmap"], ["-mla", "3"], ["-ot", "exps=CPU"], ["--jinja"]])


def _spec(**update: object) -> ServerSpec:
    return ServerSpec(
        binary=Path("/opt/llama-server"),
        model=Path("/models/m.gguf"),
        slot_save_path=Path("/state/slots"),
        **update,  # type: ignore[arg-type]
    )


@EXAMPLES
@given(
    extra=st.lists(st.text(min_size=1, max_size=12), max_size=8),
    threads=st.integers(1, 256),
    cpus=st.integers(1, 256),
)
def test_argv_holds_the_spec_flags_once_and_the_extra_arguments_untouched_after(
    extra: list[str], threads: int, cpus: int
) -> None:
    spec = _spec(extra_args=tuple(extra), threads=threads)
    argv = spec.argv(cpus=cpus)
    own = argv[: len(argv) - len(extra)]

    assert argv[len(own) :] == extra
    flags = [arg for arg in own[1:] if arg.startswith("--")]
    assert len(flags) == len(set(flags))
    assert own[own.index("--ctx-size") + 1] == str(spec.ctx)
    decode, prefill = spec.effective_threads(cpus)
    assert 1 <= decode <= min(threads, cpus)
    assert 1 <= prefill <= cpus
    assert own[own.index("--threads") + 1] == str(decode)


@EXAMPLES
@given(
    data=st.data(),
    which=st.sampled_from(sorted(SPELLINGS)),
    values=st.lists(st.integers(1, 1 << 20), min_size=1, max_size=3),
)
def test_extra_arguments_repeating_a_spec_flag_are_estimated_with_the_last_value(
    data: st.DataObject, which: str, values: list[int]
) -> None:
    extra: list[str] = []
    for value in values:
        extra += [*data.draw(OTHER), data.draw(st.sampled_from(SPELLINGS[which])), str(value)]
    base = {"ctx": 16384, "parallel": 4, "ubatch": 256, "cache_ram_mib": 8192}

    estimated = estimate_memory(SHAPE, **base, flash_attn="off", extra_args=extra)  # type: ignore[arg-type]

    direct = estimate_memory(SHAPE, **(base | {which: values[-1]}), flash_attn="off")  # type: ignore[arg-type]
    assert estimated == direct


def test_a_context_in_the_extra_arguments_is_the_one_estimated() -> None:
    plain = estimate_memory(SHAPE, ctx=4096, ubatch=256, cache_ram_mib=0)
    overridden = estimate_memory(
        SHAPE, ctx=4096, ubatch=256, cache_ram_mib=0, extra_args=["-c", "131072"]
    )

    assert overridden == estimate_memory(SHAPE, ctx=131072, ubatch=256, cache_ram_mib=0)
    assert overridden.kv_cache_bytes == 32 * plain.kv_cache_bytes


def test_a_context_of_zero_is_the_models_own_as_in_llama_server() -> None:
    trained = SHAPE.model_copy(update={"n_ctx_train": 131072})
    own = estimate_memory(trained, ctx=131072, ubatch=256, cache_ram_mib=0)
    for spelling in SPELLINGS["ctx"]:
        zero = estimate_memory(
            trained, ctx=4096, ubatch=256, cache_ram_mib=0, extra_args=[spelling, "0"]
        )
        assert zero == own
    # A header that does not say its context: the settings' stands.
    unknown = estimate_memory(SHAPE, ctx=4096, ubatch=256, cache_ram_mib=0, extra_args=["-c", "0"])
    assert unknown == estimate_memory(SHAPE, ctx=4096, ubatch=256, cache_ram_mib=0)


def test_an_unbounded_prompt_cache_is_named_not_counted_at_the_settings_cap() -> None:
    capped = estimate_memory(SHAPE, ctx=4096, ubatch=256, cache_ram_mib=8192)
    unbounded = estimate_memory(
        SHAPE, ctx=4096, ubatch=256, cache_ram_mib=8192, extra_args=["--cache-ram", "-1"]
    )

    assert unbounded.prompt_cache_unbounded
    assert unbounded.required_bytes == capped.required_bytes - 8192 * 1024 * 1024
    assert "prompt cache (--cache-ram) unbounded (-1), not counted" in unbounded.describe()
    assert "unbounded" not in capped.describe()


def test_the_last_cache_type_and_kv_unified_switch_win_as_in_llama_server() -> None:
    def kv(*extra: str) -> int:
        return estimate_memory(
            SHAPE, ctx=4096, ubatch=256, cache_ram_mib=0, extra_args=extra
        ).kv_cache_bytes

    assert kv("-ctk", "q8_0", "-ctv", "q8_0", "--cache_type_k", "f32", "-ctv", "f32") == kv(
        "-ctk", "f32", "-ctv", "f32"
    )

    def scores(*extra: str) -> int:
        return estimate_memory(
            SHAPE, ctx=4096, ubatch=256, cache_ram_mib=0, parallel=4, extra_args=extra
        ).compute_bytes

    assert scores("-fa", "on", "--flash_attn", "off", "-kvu", "-no-kvu") == scores("-fa", "off")


SIZES = st.fixed_dictionaries(
    {
        "ctx": st.integers(512, 1 << 20),
        "ubatch": st.integers(32, 4096),
        "parallel": st.integers(1, 64),
        "cache_ram_mib": st.one_of(st.none(), st.integers(0, 1 << 16)),
        "flash_attn": st.sampled_from([None, "on", "off", "auto"]),
        "extra_args": st.sampled_from([(), ("-kvu",), ("-amb", "512"), ("-ctk", "q4_0")]),
    }
)
SHAPES = st.builds(
    ModelShape,
    architecture=st.just("x"),
    file_bytes=st.integers(0, 1 << 40),
    n_layer=st.integers(1, 200),
    n_embd=st.integers(1, 1 << 14),
    n_vocab=st.integers(1, 1 << 18),
    n_head=st.integers(1, 256),
    n_head_kv=st.integers(0, 256),
    key_length=st.integers(0, 512),
    value_length=st.integers(0, 512),
    kv_lora_rank=st.one_of(st.none(), st.integers(1, 1024)),
    rope_dim=st.integers(0, 128),
)


@EXAMPLES
@given(shape=SHAPES, sizes=SIZES, more=st.integers(1, 1 << 16))
def test_the_estimate_is_never_negative_grows_with_ctx_and_ubatch_not_with_slots(
    shape: ModelShape, sizes: dict[str, object], more: int
) -> None:
    def required(**update: object) -> int:
        estimate = estimate_memory(shape, **(sizes | update))  # type: ignore[arg-type]
        parts = (estimate.kv_cache_bytes, estimate.compute_bytes, estimate.prompt_cache_bytes)
        assert min(parts) >= 0
        return estimate.required_bytes

    now = required()
    assert required(ctx=int(sizes["ctx"]) + more) >= now  # type: ignore[call-overload]
    assert required(ubatch=int(sizes["ubatch"]) + more) >= now  # type: ignore[call-overload]
    assert required(parallel=min(int(sizes["parallel"]) + more, 64)) <= now  # type: ignore[call-overload]


# ---- the GGUF header --------------------------------------------------------------------------

COUNTS = (
    "block_count",
    "embedding_length",
    "attention.head_count",
    "attention.head_count_kv",
    "context_length",
)
Adder = Callable[[gguf.GGUFWriter, str], None]


def _write(path: Path, arch: str, adders: dict[str, Adder]) -> Path:
    writer = gguf.GGUFWriter(str(path), arch)
    for key, add in adders.items():
        add(writer, f"{arch}.{key}")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _uint(value: int) -> Adder:
    return lambda writer, key: writer.add_uint32(key, value)


@FILE_EXAMPLES
@given(
    arch=st.from_regex(r"[a-z][a-z0-9]{0,11}", fullmatch=True),
    counts=st.fixed_dictionaries({key: st.integers(1, (1 << 32) - 1) for key in COUNTS}),
    per_layer=st.lists(st.integers(0, 1 << 16), min_size=1, max_size=8),
)
def test_a_gguf_header_reads_back_the_counts_written(
    arch: str, counts: dict[str, int], per_layer: list[int]
) -> None:
    adders = {key: _uint(value) for key, value in counts.items()}
    adders["attention.head_count_kv"] = lambda writer, key: writer.add_array(key, per_layer)
    with tempfile.TemporaryDirectory() as folder:
        shape = read_model_shape(_write(Path(folder) / "m.gguf", arch, adders))

    assert shape.architecture == arch
    assert shape.n_layer == counts["block_count"]
    assert shape.n_embd == counts["embedding_length"]
    assert shape.n_head == counts["attention.head_count"]
    assert shape.n_head_kv == max(per_layer)
    assert shape.n_ctx_train == counts["context_length"]


ODD: list[Adder] = [
    lambda writer, key: writer.add_string(key, "four"),
    lambda writer, key: writer.add_bool(key, True),
    lambda writer, key: writer.add_float32(key, 2.5),
    lambda writer, key: writer.add_float32(key, float("nan")),
    lambda writer, key: writer.add_array(key, ["a", "b"]),
    lambda writer, key: writer.add_int32(key, -3),
]


@FILE_EXAMPLES
@given(key=st.sampled_from(COUNTS), odd=st.sampled_from(ODD))
def test_an_odd_typed_count_in_a_gguf_header_is_a_clear_error(key: str, odd: Adder) -> None:
    adders = {name: _uint(64) for name in COUNTS} | {key: odd}
    with tempfile.TemporaryDirectory() as folder:
        path = _write(Path(folder) / "m.gguf", "llama", adders)
        with pytest.raises(ServerSpawnError) as raised:
            read_model_shape(path)
    assert str(path) in str(raised.value)


def test_a_text_where_a_gguf_count_belongs_names_the_key(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "m.gguf", "llama", {"block_count": lambda w, k: w.add_string(k, "four")}
    )

    with pytest.raises(ServerSpawnError, match=r"llama\.block_count is 'four'"):
        read_model_shape(path)


def test_a_file_that_is_no_gguf_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(b"not a gguf file at all")

    with pytest.raises(ServerSpawnError, match="not a readable GGUF file"):
        read_model_shape(path)
