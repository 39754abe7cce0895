"""The demo's own Dagster instance: telemetry off on a fresh state dir, a user's settings kept."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
import yaml

from kimi_batch.cli.demo import _seed_inbox, demo_instance
from kimi_batch.settings import Settings, samples_dir


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


def test_the_inbox_the_demo_creates_and_its_samples_are_owner_only(settings: Settings) -> None:
    """Found by audit: the demo made the inbox 0755 and copied the samples 0644, where the
    design keeps prompts 0600 in 0700 folders."""
    _seed_inbox(settings)

    inbox = settings.paths.inbox_dir
    assert stat.S_IMODE(inbox.stat().st_mode) == 0o700
    samples = sorted(path.name for path in samples_dir().iterdir() if path.is_file())
    assert sorted(path.name for path in inbox.iterdir()) == samples
    for name in samples:
        copy, shipped = (inbox / name).stat(), (samples_dir() / name).stat()
        assert stat.S_IMODE(copy.st_mode) == 0o600
        assert copy.st_mtime_ns == shipped.st_mtime_ns  # settled at once, as shipped
        assert (inbox / name).read_bytes() == (samples_dir() / name).read_bytes()


def test_an_inbox_a_team_set_up_keeps_its_modes(settings: Settings) -> None:
    inbox = settings.paths.inbox_dir
    inbox.mkdir(parents=True)
    inbox.chmod(0o2770)  # a group's drop folder
    _seed_inbox(settings)
    assert stat.S_IMODE(inbox.stat().st_mode) == 0o2770
