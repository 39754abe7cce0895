"""ServerSpec -> argv: the source documents' defaults, thread clamping, secrets off argv."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from kimi_batch.llama.server import ServerSpec


def _spec(**overrides: object) -> ServerSpec:
    fields: dict[str, object] = {
        "binary": Path("/opt/llama/llama-server"),
        "model": Path("/models/Kimi-K2.5-Q4_K_S-00001-of-00013.gguf"),
        "slot_save_path": Path("/var/kimi/slots"),
    }
    fields.update(overrides)
    return ServerSpec.model_validate(fields)


def _flag(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def _configured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **variables: str) -> list[str]:
    """The argv a deployment's settings give (a stand-in model file, `variables` set)."""
    from kimi_batch.llama.factory import spec_from_settings
    from kimi_batch.settings import Settings

    model = tmp_path / "main.gguf"
    model.write_bytes(b"GGUF")
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KIMI_BATCH_MODEL", str(model))
    monkeypatch.setenv("KIMI_BATCH_LLAMA_SERVER", "/bin/true")
    for name, value in variables.items():
        monkeypatch.setenv(f"KIMI_BATCH_{name}", value)
    return spec_from_settings(Settings.from_env()).argv(cpus=16)


def test_default_argv_follows_the_batch_settings_on_a_16_core_box() -> None:
    argv = _spec().argv(cpus=16)
    assert _flag(argv, "--threads") == "13"
    assert _flag(argv, "--ctx-size") == "16384"
    assert _flag(argv, "--ubatch-size") == "256"
    assert _flag(argv, "--cache-ram") == "8192"
    assert _flag(argv, "--n-predict") == "1024"
    assert _flag(argv, "--host") == "127.0.0.1"
    assert _flag(argv, "--slot-save-path") == "/var/kimi/slots"
    assert _flag(argv, "--alias") == "Kimi-K2.5-Q4_K_S-00001-of-00013"
    assert "--metrics" in argv


def test_threads_above_the_cpus_are_clamped_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="kimi_batch.llama.server"):
        argv = _spec().argv(cpus=2)
    assert _flag(argv, "--threads") == "2"
    assert _flag(argv, "--threads-batch") == "2"
    assert any("clamped to 2" in record.getMessage() for record in caplog.records)


def test_asking_the_thread_count_warns_of_nothing(caplog: pytest.LogCaptureFixture) -> None:
    """`status` asks it of a running server: only building the start's argv warns."""
    with caplog.at_level(logging.WARNING, logger="kimi_batch.llama.server"):
        assert _spec().effective_threads(cpus=2) == (2, 2)
    assert not caplog.records


def test_no_warning_when_threads_fit(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="kimi_batch.llama.server"):
        argv = _spec().argv(cpus=13)
    assert _flag(argv, "--threads") == "13"
    assert not caplog.records


def test_extra_args_pass_through_untouched_at_the_end() -> None:
    extra = ("-mla", "3", "-amb", "512", "-ot", "exps=CPU", "--merge-qkv")
    argv = _spec(extra_args=extra).argv(cpus=16)
    assert tuple(argv[-len(extra) :]) == extra


@pytest.mark.parametrize(
    ("extra", "slots"),
    [
        ((), 4),
        (("-np", "8"), 8),
        (("--parallel", "2"), 2),
        (("--parallel=2",), 4),  # llama-server refuses it ("invalid argument"): no count
        (("-np", "8", "--parallel", "3"), 3),  # the last one wins, as in llama-server
        (("-np", "-1"), 4),  # auto: not known here, the settings' count stands
    ],
)
def test_the_slots_are_the_extra_arguments_np_where_they_give_one(
    extra: tuple[str, ...], slots: int
) -> None:
    spec = _spec(parallel=4, extra_args=extra)
    assert spec.slots == slots
    assert f"slots={slots} " in spec.describe()


def test_cache_ram_can_be_omitted_for_builds_without_it() -> None:
    assert "--cache-ram" not in _spec(cache_ram_mib=None).argv(cpus=16)


def test_spec_has_no_api_key_field_so_it_cannot_reach_argv_or_the_spec_file() -> None:
    with pytest.raises(ValueError, match="api_key"):
        _spec(api_key="secret")


def test_specs_compare_by_value() -> None:
    assert _spec() == _spec()
    assert _spec(ctx=8192) != _spec()


def test_speculative_decoding_settings_reach_argv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    draft = tmp_path / "draft.gguf"
    argv = _configured(
        tmp_path, monkeypatch, LLAMA_SPEC="draft-simple", LLAMA_DRAFT_MODEL=str(draft)
    )
    assert _flag(argv, "--spec-type") == "draft-simple"
    assert _flag(argv, "--model-draft") == str(draft)


def test_no_speculation_flags_by_default() -> None:
    argv = _spec().argv(cpus=16)
    assert "--spec-type" not in argv
    assert "--model-draft" not in argv


def test_a_malformed_spec_type_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from kimi_batch.errors import ConfigError
    from kimi_batch.settings import Settings

    monkeypatch.setenv("KIMI_BATCH_LLAMA_SPEC", "ngram simple; rm")
    with pytest.raises(ConfigError, match="llama_spec"):
        Settings.from_env()


def test_flash_attention_is_the_builds_default_unless_set() -> None:
    """Unset, no flag: the build decides (llama.cpp's `auto`), and an older build whose -fa
    takes no value is never handed one it would refuse."""
    assert "--flash-attn" not in _spec().argv(cpus=16)
    assert _flag(_spec(flash_attn="off").argv(cpus=16), "--flash-attn") == "off"


def test_a_spec_names_its_flash_attention_so_a_refused_start_shows_the_difference() -> None:
    # A server started before the embedded default turned it off differs only there.
    assert "flash_attn=default" in _spec().describe()
    assert "flash_attn=off" in _spec(flash_attn="off").describe()


def test_the_flash_attention_setting_reaches_argv_and_refuses_other_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kimi_batch.errors import ConfigError

    assert (
        _flag(_configured(tmp_path, monkeypatch, LLAMA_FLASH_ATTN="off"), "--flash-attn") == "off"
    )
    monkeypatch.delenv("KIMI_BATCH_LLAMA_FLASH_ATTN")
    assert "--flash-attn" not in _configured(tmp_path, monkeypatch)
    with pytest.raises(ConfigError, match="KIMI_BATCH_LLAMA_FLASH_ATTN"):
        _configured(tmp_path, monkeypatch, LLAMA_FLASH_ATTN="false")


def test_the_embedded_default_runs_without_flash_attention_unless_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bundled SmolLM2 on the bundled build: off (its decode over the cached digest measured
    faster); the same model on a user's own binary, which may be an older build whose `-fa`
    takes no value: no flag."""
    from kimi_batch.llama.factory import spec_from_settings
    from kimi_batch.settings import Settings

    for name in ("MODEL", "LLAMA_SERVER", "LLAMA_FLASH_ATTN"):
        monkeypatch.delenv(f"KIMI_BATCH_{name}", raising=False)
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path / "home"))

    def flash_attn() -> str | None:
        argv = spec_from_settings(Settings.from_env()).argv(cpus=16)
        return _flag(argv, "--flash-attn") if "--flash-attn" in argv else None

    assert flash_attn() == "off"
    monkeypatch.setenv("KIMI_BATCH_LLAMA_FLASH_ATTN", "on")
    assert flash_attn() == "on"
    monkeypatch.delenv("KIMI_BATCH_LLAMA_FLASH_ATTN")
    own_build = tmp_path / "llama-server"
    own_build.write_text("#!/bin/sh\n")
    own_build.chmod(0o755)
    monkeypatch.setenv("KIMI_BATCH_LLAMA_SERVER", str(own_build))
    assert flash_attn() is None
