"""Finishing a Batch API batch: its output file is streamed, never held whole in memory.

Each measurement runs in its own process (`finish_memory_probe`); the peak RSS growth is the
kernel's VmHWM, a memory bound (never a time one). Measured here, 100 lines asking
`top_logprobs: 20` with 300-token answers (45 MiB of output): 468 MB of growth before the
files were streamed, 20 MB after.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

MIB = 1 << 20


def _probe(home: Path, mode: str, rows: int, tokens: int) -> dict[str, float]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "kimi_batch_tests.support.finish_memory_probe",
            mode,
            str(rows),
            str(tokens),
        ],
        env={**os.environ, "KIMI_BATCH_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    print(report)
    return report


def test_finishing_a_batch_with_logprobs_takes_less_memory_than_its_output(
    tmp_path: Path,
) -> None:
    report = _probe(tmp_path, "finish", 100, 300)
    output_mb = report["output_bytes"] / MIB
    assert output_mb > 40  # the story's scale: logprobs make the output file large
    # The whole output held once is already `output_mb`; before it was held ~10 times.
    assert report["growth_mb"] < output_mb / 2
