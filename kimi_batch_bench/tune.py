"""`kimi-batch tune`: how many threads and slots to give llama-server on this machine.

Threads: `llama-bench` prompt and generation tok/s for each count (single stream, like the source
documents' table); the knee is the smallest count within 10% of the best generation speed (decode
is memory-bound: past the knee more threads only contend). Slots: `llama-batched-bench` aggregate
generation tok/s for 1, 2, 4, 8 parallel sequences; the knee is the count past which the aggregate
grows by less than 10%. Flash attention: the knee's slots decoding over a shared digest-long
prompt with `-fa on` and `-fa off`; off is named when it generates 10% faster (on a CPU llama.cpp
turns it on by default, which some CPUs and models decode slower with).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.llama import find_tool
from kimi_batch.settings import FlashAttention
from kimi_batch_bench.plan import Speeds, save_speeds
from kimi_batch_bench.report import markdown_table
from kimi_batch_bench.sweeps import BatchedPoint, ThreadPoint, batched_bench, thread_bench

__all__ = [
    "TuneOptions",
    "flash_attn_choice",
    "run_tune",
    "slot_knee",
    "thread_knee",
    "tune_table",
]

KNEE_FRACTION = 0.10
TOOLS = ("llama-bench", "llama-batched-bench")


class TuneOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    threads: tuple[int, ...] = Field(description="Thread counts to try.")
    slots: tuple[int, ...] = (1, 2, 4, 8)
    prompt_tokens: int = Field(default=256, ge=1)
    output_tokens: int = Field(default=64, ge=1)
    ctx_per_slot: int = Field(default=2048, ge=128)
    repetitions: int = Field(default=2, ge=1)
    digest_tokens: int = Field(
        default=1024, ge=1, description="Shared prompt of the flash-attention comparison."
    )
    flash_attn: FlashAttention | None = Field(
        default=None,
        description="The server's flash attention: the thread and slot sweeps, and the speeds "
        "`plan` reads, run as the server does (None: the build's default).",
    )
    tool_args: tuple[str, ...] = Field(
        default=(),
        description="More arguments for both tools, last on their command lines: the model "
        "flags the server gets (MLA, offload), which the tools do not read from it.",
    )


def thread_knee(points: Sequence[ThreadPoint]) -> int:
    """Smallest thread count whose generation speed is within 10% of the best."""
    best = max(p.gen_tok_s for p in points)
    return min(p.threads for p in points if p.gen_tok_s >= (1 - KNEE_FRACTION) * best)


def slot_knee(points: Sequence[BatchedPoint]) -> int:
    """The slot count past which the aggregate generation speed grows by less than 10%.

    The last step that still gained 10% names it: one flat step between noisy measurements
    (a busy machine) does not stop the sweep early.
    """
    ordered = sorted(points, key=lambda p: p.slots)
    knee = ordered[0].slots
    for current, following in pairwise(ordered):
        if following.gen_tok_s >= (1 + KNEE_FRACTION) * current.gen_tok_s:
            knee = following.slots
    return knee


def flash_attn_choice(on: BatchedPoint, off: BatchedPoint) -> Literal["off"] | None:
    """`off` where it generates 10% faster than on; None keeps the build's default (on)."""
    return "off" if off.gen_tok_s >= (1 + KNEE_FRACTION) * on.gen_tok_s else None


def tune_table(document: dict[str, Any]) -> str:
    threads = markdown_table(
        ["threads", "prompt tok/s", "generation tok/s"],
        [
            [
                f"{p['threads']}{' (knee)' if p['threads'] == document['thread_knee'] else ''}",
                f"{p['prompt_tok_s']:.1f}",
                f"{p['gen_tok_s']:.1f}",
            ]
            for p in document["threads"]
        ],
    )
    slots = markdown_table(
        ["slots", "aggregate generation tok/s", "per slot", "prompt tok/s"],
        [
            [
                f"{p['slots']}{' (knee)' if p['slots'] == document['slot_knee'] else ''}",
                f"{p['gen_tok_s']:.1f}",
                f"{p['gen_tok_s'] / p['slots']:.1f}",
                f"{p['prompt_tok_s']:.1f}",
            ]
            for p in document["slots"]
        ],
    )
    chosen = document["flash_attn_choice"] or "on"
    attention = markdown_table(
        ["flash attention", "aggregate generation tok/s", "prompt tok/s"],
        [
            [
                f"{mode}{' (use)' if mode == chosen else ''}",
                f"{point['gen_tok_s']:.1f}",
                f"{point['prompt_tok_s']:.1f}",
            ]
            for mode, point in document["flash_attn"].items()
        ],
    )
    return f"{threads}\n\n{slots}\n\n{attention}\n"


def _flash_attention_at(
    model: Path, options: TuneOptions, *, threads: int, slots: int, server: Path | None
) -> dict[str, BatchedPoint]:
    """Decode with flash attention on and off over a digest-long shared prompt."""
    return {
        mode: batched_bench(
            model,
            slots=(slots,),
            prompt_tokens=options.digest_tokens,
            output_tokens=options.output_tokens,
            threads=threads,
            ctx_per_slot=max(options.ctx_per_slot, options.digest_tokens + options.output_tokens),
            flash_attn=mode,
            server=server,
            extra_args=options.tool_args,
        )[0]
        for mode in ("on", "off")
    }


def run_tune(
    model: Path, options: TuneOptions, *, out_dir: Path, server: Path | None = None
) -> dict[str, Any]:
    """Both sweeps, with the tools of `server`'s build (`find_tool`); records the per-slot speeds
    at the knees for `plan`."""
    threads = thread_bench(
        model,
        threads=options.threads,
        prompt_tokens=options.prompt_tokens,
        output_tokens=options.output_tokens,
        repetitions=options.repetitions,
        flash_attn=options.flash_attn,
        server=server,
        extra_args=options.tool_args,
    )
    t_knee = thread_knee(threads)
    slots = batched_bench(
        model,
        slots=options.slots,
        prompt_tokens=options.prompt_tokens,
        output_tokens=options.output_tokens,
        threads=t_knee,
        ctx_per_slot=options.ctx_per_slot,
        flash_attn=options.flash_attn,
        server=server,
        extra_args=options.tool_args,
    )
    s_knee = slot_knee(slots)
    at_knee = next(p for p in slots if p.slots == s_knee)
    knee_threads = next(p for p in threads if p.threads == t_knee)
    attention = _flash_attention_at(model, options, threads=t_knee, slots=s_knee, server=server)
    flash_attn = flash_attn_choice(attention["on"], attention["off"])
    save_speeds(
        out_dir,
        Speeds(
            # Prompt work is compute-bound: the slots busy at once share it.
            prompt_tok_s=max(knee_threads.prompt_tok_s / s_knee, 1e-6),
            gen_tok_s=max(at_knee.gen_tok_s / s_knee, 1e-6),
            slots=s_knee,
            source="tune",
        ),
    )
    return {
        "model": str(model),
        "threads": [p.model_dump() for p in threads],
        "slots": [p.model_dump() for p in slots],
        "flash_attn": {mode: point.model_dump() for mode, point in attention.items()},
        "thread_knee": t_knee,
        "slot_knee": s_knee,
        "flash_attn_choice": flash_attn,
        "settings": {
            "KIMI_BATCH_LLAMA_THREADS": t_knee,
            "KIMI_BATCH_LLAMA_PARALLEL": s_knee,
            **({"KIMI_BATCH_LLAMA_FLASH_ATTN": flash_attn} if flash_attn else {}),
        },
        "options": options.model_dump(),
        "tools": {name: str(find_tool(name, beside=server)) for name in TOOLS},
    }
