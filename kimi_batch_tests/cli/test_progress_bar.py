"""`kimi-batch demo` on a terminal: its output starts with the progress bar, not with log lines.

The demo runs under a real pseudo-terminal against the session's real llama-server (attached by
URL, with a state dir of its own holding one small inbox file), so rich sees a terminal exactly as
it does for a user.
"""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kimi_batch.cli.demo import DIGEST_LABEL

pytestmark = pytest.mark.slow

CLI = Path(sys.executable).parent / "kimi-batch"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
FINISHED_BAR = re.compile(r"^(?P<asset>\w+) \S+\s.*?(?P<done>\d+)/(?P<total>\d+) rows")


def _run_on_a_terminal(argv: list[str], env: dict[str, str], timeout_s: float) -> tuple[int, str]:
    master, slave = pty.openpty()
    process = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env)
    os.close(slave)
    chunks: list[bytes] = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    return process.wait(timeout=timeout_s), b"".join(chunks).decode("utf-8", "replace")


@pytest.mark.timeout(1800)
def test_demo_output_starts_with_the_progress_bar(llama_env: Any, tmp_path: Path) -> None:
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "tiny.jsonl").write_text('{"id": "t1", "prompt": "Name one primary color."}\n')
    env = {
        **os.environ,
        "KIMI_BATCH_HOME": str(tmp_path),
        "KIMI_BATCH_LLAMA_URL": llama_env.base_url,
        "TERM": "xterm-256color",
        "COLUMNS": "160",
    }
    env.pop("DAGSTER_HOME", None)
    code, output = _run_on_a_terminal([str(CLI), "demo"], env, timeout_s=1500)
    assert code == 0, output[-3000:]

    text = ANSI.sub("", output).replace("\r\n", "\n")
    # Rich redraws lines with carriage returns; what a reader sees first is the first bar.
    visible = text.replace("\r", "").lstrip("\n")
    assert visible.startswith(DIGEST_LABEL), repr(text[:500])
    screen = [line.split("\r")[-1] for line in text.split("\n")]
    assert not any(" - dagster - INFO - " in line for line in screen), "log lines under the bar"
    bars = [line for line in screen if "rows" in line and "tok/s" in line and "ETA" in line]
    finished = {}
    for line in bars:
        found = FINISHED_BAR.match(line)
        if found and found["done"] == found["total"]:
            finished[found["asset"]] = int(found["done"])
    # One seed, three strategies: three variants; the last frame of each bar is complete.
    assert finished.get("amplified_prompts") == 3, bars[-6:]
    assert finished.get("distilled_responses", 0) >= 1, bars[-6:]
    summary = json.loads(next(line for line in reversed(screen) if line.startswith("{")))
    assert summary["partitions"] == 1
    assert summary["rows_amplified"] >= 1
