"""The demo's own Dagster instance: telemetry off on a fresh state dir, a user's settings kept."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kimi_batch.cli.demo import demo_instance
from kimi_batch.settings import Settings


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    return Settings.from_env()


def test_a_fresh_state_dir_gets_an_instance_with_telemetry_off(settings: Settings) -> None:
    instance = demo_instance(settings)
    config = settings.paths.dagster_home / "dagster.yaml"
    assert yaml.safe_load(config.read_text()) == {"telemetry": {"enabled": False}}
    assert instance.telemetry_enabled is False
    assert not instance.is_ephemeral  # a real instance on disk, whose runs `status` reads


def test_an_instance_config_already_there_is_left_as_it_is(settings: Settings) -> None:
    home = settings.paths.dagster_home
    home.mkdir(parents=True)
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: true\n")
    instance = demo_instance(settings)
    assert (home / "dagster.yaml").read_text() == "telemetry:\n  enabled: true\n"
    assert instance.telemetry_enabled is True
