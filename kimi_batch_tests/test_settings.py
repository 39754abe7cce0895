"""The KIMI_BATCH_* environment contract of DESIGN.md."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kimi_batch.settings import Settings, default_digest_path


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    # Other fixtures (the session's llama_env) set KIMI_BATCH_* for the whole run.
    for name in [n for n in os.environ if n.startswith("KIMI_BATCH_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    return monkeypatch


def test_defaults(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    settings = Settings.from_env()
    assert settings.home == tmp_path / "var"
    assert settings.warehouse_dir == tmp_path / "var" / "warehouse"
    assert settings.inbox_dir == tmp_path / "var" / "inbox"
    assert settings.llama_port == 8081
    assert settings.trino_port == 8080
    assert settings.trino_host is None
    assert settings.trino_catalog == "hive"
    assert settings.trino_schema == "kimi_batch"
    assert settings.llama_threads == 13
    assert settings.llama_cache_ram_mib == 8192
    assert settings.digest == default_digest_path()


def test_overrides(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_env.setenv("KIMI_BATCH_HOME", str(tmp_path / "state"))
    clean_env.setenv("KIMI_BATCH_WAREHOUSE", str(tmp_path / "lake"))
    clean_env.setenv("KIMI_BATCH_LLAMA_CACHE_RAM", "off")
    clean_env.setenv("KIMI_BATCH_LLAMA_EXTRA_ARGS", "-mla 3 -amb 512 -ot exps=CPU")
    settings = Settings.from_env()
    assert settings.home == tmp_path / "state"
    assert settings.warehouse_dir == tmp_path / "lake"
    assert settings.llama_cache_ram_mib is None
    assert settings.llama_extra_args == ("-mla", "3", "-amb", "512", "-ot", "exps=CPU")


def test_a_bad_number_is_a_clear_error(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("KIMI_BATCH_LLAMA_PORT", "eighty")
    with pytest.raises(ValueError, match="KIMI_BATCH_LLAMA_PORT must be an integer"):
        Settings.from_env()
