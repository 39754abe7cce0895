"""Markdown tables and PNG charts of `bench` and `tune` results (matplotlib, the `bench` extra)."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kimi_batch_bench.errors import BenchError

__all__ = [
    "bench_chart",
    "bench_table",
    "markdown_table",
    "night_table",
    "require_charts",
    "tune_chart",
]

_COLUMNS: tuple[tuple[str, str | tuple[str, str], str], ...] = (
    ("gen tok/s", "gen_tok_s", "{:.1f}"),
    ("incl. warm-up", "gen_tok_s_incl_warmup", "{:.1f}"),
    ("wall s", "wall_s", "{:.1f}"),
    ("warm-up s", "warmup_s", "{:.2f}"),
    ("prompt tok eval.", "prompt_tokens_evaluated", "{:d}"),
    ("prompt tok/s", "prompt_tok_s", "{:.0f}"),
    ("TTFT p50/p95 ms", ("ttft_p50_ms", "ttft_p95_ms"), "{:.0f}/{:.0f}"),
    ("latency p50/p95 ms", ("latency_p50_ms", "latency_p95_ms"), "{:.0f}/{:.0f}"),
    ("re-prefills", "digest_reprefills", "{:d}"),
    ("cache hit min/mean", ("cache_hit_min", "cache_hit_mean"), "{:.2f}/{:.2f}"),
    ("peak RSS MB", "peak_rss_mb", "{:.0f}"),
)
_LABELS = {
    "naive": "(A) naive sequential",
    "all_slots": "(B) all-slots client",
    "engine": "(C) engine",
    "dagster": "(D) Dagster partition",
}


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _cell(report: dict[str, Any], key: str | tuple[str, ...], fmt: str) -> str:
    keys = key if isinstance(key, tuple) else (key,)
    return fmt.format(*(report[k] for k in keys))


# The figures of the workloads without contenders, in the order the table shows them.
_FIGURES: dict[str, tuple[str, ...]] = {
    "rewrite": (
        "requests", "output_tokens", "slots", "spec_type", "engine_tok_s", "engine_spec_tok_s",
        "spec_speedup", "spec_acceptance", "spec_drafted_per_request",
        "spec_accepted_per_request", "spec_identical_fraction",
    ),
    "night": (
        "partitions", "rows", "runs", "run_statuses", "busy_fraction", "wall_s", "tok_s",
        "engine_one_batch_tok_s", "night_over_one_batch", "engine_one_batch_busy_fraction",
        "idle_s", "client_cpu", "pinning",
    ),
    "rehearsal": (
        "rows", "partitions", "time_scale", "window_h", "rows_done_in_window", "plan_rows",
        "plan_error", "next_night_rows", "plan_next_night_rows", "plan_next_night_error",
        "plan_row_s", "measured_row_s", "runs", "night_overhead_s", "partition_overhead_s",
        "busy_fraction", "busy_fraction_at_target", "wall_s",
    ),
    "api_prompts": (
        "lines", "slots", "max_in_flight", "slot_occupancy", "busy_fraction",
        "system_prompts", "prompt_warmups", "prompt_restores", "one_off_prompt_prefills",
        "server_completions", "server_prompt_tokens", "slot_saves_peak", "slot_saves_left",
        "slot_saves_max", "wall_s",
    ),
}  # fmt: skip


def _figure(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {_figure(v)}" for k, v in value.items())
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _figures_table(name: str, section: dict[str, Any]) -> str:
    rows = [[key, _figure(section[key])] for key in _FIGURES[name] if key in section]
    return f"**{name}**\n\n{markdown_table(['figure', 'value'], rows)}"


# The processes that are the orchestration (the bench, the server and the rest of the box are not).
ORCHESTRATION = ("run_worker", "daemon", "code_servers", "webserver")


def _night_headline(night: dict[str, Any]) -> str:
    cpu = night.get("cpu_s") or {}
    orchestration = sum(float(cpu.get(group, 0.0)) for group in ORCHESTRATION)
    wall = float(cpu.get("wall") or 0.0)
    share = f" ({100 * orchestration / wall:.0f} % of one core)" if wall else ""
    return (
        f"night / one batch **{night['night_over_one_batch']:.3f}** ({night['tok_s']:.2f} / "
        f"{night['engine_one_batch_tok_s']:.2f} tok/s), busy fraction "
        f"**{night['busy_fraction']:.3f}**; orchestration CPU {orchestration:.1f} s in "
        f"{wall:.0f} s{share}"
    )


def _cpu_table(columns: dict[str, dict[str, Any]]) -> str:
    """CPU seconds by process group, one column per sampled span."""
    from kimi_batch_bench.cpu import GROUPS

    header = [
        "CPU seconds",
        *(f"{name} ({split.get('wall', 0):.0f} s)" for name, split in columns.items()),
    ]
    rows = [
        [group, *(f"{float(split.get(group, 0.0)):.1f}" for split in columns.values())]
        for group in (*GROUPS, "machine")
    ]
    orchestration = [
        f"{sum(float(split.get(g, 0.0)) for g in ORCHESTRATION):.1f}" for split in columns.values()
    ]
    rows.append([f"orchestration ({' + '.join(ORCHESTRATION)})", *orchestration])
    return markdown_table(header, rows)


def night_table(document: dict[str, Any]) -> str:
    """The night: its headline (night / one batch, busy fraction, orchestration CPU), the CPU
    split by process group, the other figures; the pinned night beside it when measured."""
    nights = {name: document[name] for name in ("night", "night_pinned") if document.get(name)}
    parts: list[str] = []
    columns: dict[str, dict[str, Any]] = {}
    for name, night in nights.items():
        label = "pinned" if name == "night_pinned" else "night"
        parts.append(f"**{name}**: {_night_headline(night)}")
        columns[label] = night.get("cpu_s") or {}
        if name == "night":
            columns["one batch"] = night.get("one_batch_cpu_s") or {}
    if len(nights) == 2:
        ratio = nights["night_pinned"]["tok_s"] / nights["night"]["tok_s"]
        parts.append(f"pinned night / unpinned night (tok/s): **{ratio:.3f}**")
    parts.append(_cpu_table(columns))
    for name, night in nights.items():
        rows = [[key, _figure(night[key])] for key in _FIGURES["night"] if key in night]
        parts.append(f"**{name}**\n\n{markdown_table(['figure', 'value'], rows)}")
    return "\n\n".join(parts)


def bench_table(document: dict[str, Any]) -> str:
    parts: list[str] = []
    for workload in ("distill", "amplify"):
        section = document.get(workload)
        if not section:
            continue
        header = ["contender", *(title for title, _, _ in _COLUMNS)]
        rows = [
            [_LABELS.get(name, name), *(_cell(report, key, fmt) for _, key, fmt in _COLUMNS)]
            for name, report in section["contenders"].items()
        ]
        if "ceiling_tok_s" in section:
            empty = [""] * (len(_COLUMNS) - 1)
            rows.append(["llama-batched-bench ceiling", f"{section['ceiling_tok_s']:.1f}", *empty])
        summary = (
            f"engine / all-slots client: {section['engine_over_limit']:.2f} "
            f"({section['engine_over_limit_incl_warmup']:.2f} with warm-up); "
            f"evaluated prompt tokens engine / client: {section['prompt_tokens_ratio']:.2f}; "
            f"plan predicted the engine's wall within {abs(section['plan_error']) * 100:.0f}%"
        )
        if "orchestration_overhead_s" in section:
            summary += f"; Dagster overhead (D - C): {section['orchestration_overhead_s']:.1f} s"
        parts.append(
            f"**{workload}** ({section['requests']} requests, {section['output_tokens']} output "
            f"tokens each)\n\n{markdown_table(header, rows)}\n\n{summary}"
        )
    parts += [
        night_table(document) if name == "night" else _figures_table(name, document[name])
        for name in _FIGURES
        if document.get(name)
    ]
    return "\n\n".join(parts) + "\n"


def require_charts() -> None:
    """`bench` and `tune` end with a chart: say what is missing before minutes of measuring."""
    if importlib.util.find_spec("matplotlib") is None:
        raise BenchError(
            "the bench draws its charts with matplotlib: install the bench extra "
            "(pip install 'kimi_batch[bench]')"
        )


def bench_chart(document: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = [w for w in ("distill", "amplify") if document.get(w)]
    if not workloads:
        return _figures_chart(document, path)
    fig, axes = plt.subplots(1, len(workloads), figsize=(5.5 * len(workloads), 3.6), squeeze=False)
    for axis, workload in zip(axes[0], workloads, strict=True):
        section = document[workload]
        names = list(section["contenders"])
        speeds = [section["contenders"][n]["gen_tok_s"] for n in names]
        labels = [str(_LABELS.get(n, n)).split(" ", 1)[0] for n in names]
        bars = axis.bar(labels, speeds, color="#4c72b0")
        axis.bar_label(bars, fmt="%.1f")
        if "ceiling_tok_s" in section:
            axis.axhline(section["ceiling_tok_s"], color="#c44e52", linestyle="--", label="ceiling")
            axis.legend(loc="lower right")
        axis.set_title(f"{workload}: generated tok/s")
        axis.set_ylabel("tok/s")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _figures_chart(document: dict[str, Any], path: Path) -> Path:
    """Bars of the headline figures of rewrite / night / rehearsal (no contenders there)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars: dict[str, float] = {}
    if rewrite := document.get("rewrite"):
        bars["rewrite tok/s"] = rewrite["engine_tok_s"]
        bars[f"+ {rewrite['spec_type']}"] = rewrite["engine_spec_tok_s"]
    if night := document.get("night"):
        bars["night tok/s"] = night["tok_s"]
        bars["one batch tok/s"] = night["engine_one_batch_tok_s"]
    if pinned := document.get("night_pinned"):
        bars["pinned night"] = pinned["tok_s"]
        bars["pinned one batch"] = pinned["engine_one_batch_tok_s"]
    if rehearsal := document.get("rehearsal"):
        bars["rehearsal rows"] = rehearsal["rows_done_in_window"]
        bars["plan rows"] = rehearsal["plan_rows"]
    if api := document.get("api_prompts"):
        bars["api slots busy (mean)"] = api["slot_occupancy"] * api["slots"]
        bars["api max in flight"] = api.get("max_in_flight", 0)
    night_panels = bool(night and night.get("cpu_s"))
    fig, axes = plt.subplots(1, 3 if night_panels else 1, figsize=(17 if night_panels else 6, 3.6))
    axis = axes[0] if night_panels else axes
    drawn = axis.bar(list(bars), list(bars.values()), color="#4c72b0")
    axis.bar_label(drawn, fmt="%.1f")
    if night and night_panels:
        _cpu_panel(axes[1], night, document.get("night_pinned"))
        _token_rate_panel(axes[2], night)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _cpu_panel(axis: Any, night: dict[str, Any], pinned: dict[str, Any] | None) -> None:
    """CPU seconds by process group, stacked, for the night, the one-batch run and the pinned
    night when measured."""
    runs = {"night": night["cpu_s"], "one batch": night.get("one_batch_cpu_s", {})}
    if pinned and pinned.get("cpu_s"):
        runs["pinned night"] = pinned["cpu_s"]
    from kimi_batch_bench.cpu import GROUPS  # the groups in one order, one colour each

    groups = [g for g in GROUPS if g in night["cpu_s"]]
    bottoms = [0.0] * len(runs)
    for group in groups:
        values = [float(split.get(group, 0.0)) for split in runs.values()]
        if any(values):
            axis.bar(list(runs), values, bottom=bottoms, label=group)
            bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
    axis.set_title("CPU seconds by process group")
    axis.legend(fontsize="small")


def _token_rate_panel(axis: Any, night: dict[str, Any]) -> None:
    """The server's generated tok/s over the night, the runs and steps shaded under it."""
    points = night.get("server_tok_s_over_time") or []
    for number, (kind, start, end) in enumerate(night.get("events") or []):
        axis.axvspan(start, end, alpha=0.08 if kind == "run" else 0.15, color=f"C{number % 10}")
    if points:
        # llama-server counts a request's tokens when it ends: a window of ~5 points evens that.
        width = min(5, len(points))
        rates = [p[1] for p in points]
        smooth = [sum(rates[max(0, i - width + 1) : i + 1]) / width for i in range(len(rates))]
        axis.plot([p[0] for p in points], smooth, color="#4c72b0")
    axis.set_title("server tok/s over the night, 10 s mean (runs and steps shaded)")
    axis.set_xlabel("s from the first request")
    axis.set_ylabel("tok/s")


def tune_chart(document: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    threads = document["threads"]
    xs = [p["threads"] for p in threads]
    left.plot(xs, [p["gen_tok_s"] for p in threads], marker="o", label="generation")
    left.plot(xs, [p["prompt_tok_s"] for p in threads], marker="s", label="prompt")
    left.axvline(document["thread_knee"], color="#c44e52", linestyle="--", label="knee")
    left.set_xlabel("threads")
    left.set_ylabel("tok/s (single stream)")
    left.set_yscale("log")
    left.legend()
    slots = document["slots"]
    right.plot([p["slots"] for p in slots], [p["gen_tok_s"] for p in slots], marker="o")
    right.axvline(document["slot_knee"], color="#c44e52", linestyle="--", label="knee")
    right.set_xlabel("parallel slots")
    right.set_ylabel("aggregate generation tok/s")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
