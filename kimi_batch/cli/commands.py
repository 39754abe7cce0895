"""`kimi-batch`: manage the resident server and run the pipeline outside the UI.

`main` reads the environment once (`Settings.from_env`) and hands that `Settings` to the command;
`digest lint` needs none, so a bad `KIMI_BATCH_*` variable does not stop it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from kimi_batch.errors import KimiBatchError
from kimi_batch.llama import server_from_settings
from kimi_batch.settings import Settings

__all__ = ["main"]


def _refuse_unfit_context(settings: Settings) -> None:
    """Before a model load (minutes on the target): does a slot hold digest + prompt + answer?
    The digest is estimated from its characters: no tokenizer runs before the server does."""
    from kimi_batch.engine import PROMPT_ALLOWANCE_TOKENS, check_fit, estimate_tokens, load_digest

    if not settings.digest.is_file():
        return  # the digest's own commands name a missing file; starting needs none
    check_fit(
        digest_tokens=estimate_tokens(load_digest(settings.digest).text),
        digest_estimated=True,
        prompt_tokens=PROMPT_ALLOWANCE_TOKENS,
        answer_tokens=settings.llama_n_predict,
        ctx=settings.llama_ctx,
        slots=settings.llama_parallel,
    )


def _server_start(args: argparse.Namespace, settings: Settings) -> int:
    if not settings.llama_url:  # an attached server is checked on its own numbers (/props)
        _refuse_unfit_context(settings)
    manager = server_from_settings(settings, load_timeout_s=args.load_timeout)
    handle = manager.ensure_running()
    if handle.previous_exit:
        print(f"kimi-batch: warning: the previous {handle.previous_exit}", file=sys.stderr)
    print(handle.model_dump_json() if args.json else _describe_handle(handle.model_dump()))
    return 0


def _describe_handle(handle: dict[str, object]) -> str:
    verb = "started" if handle["spawned"] else "attached to"
    return (
        f"{verb} llama-server pid {handle['pid']} at {handle['base_url']} "
        f"({handle['model']}, {handle['slots']} slots)"
    )


def _server_status(args: argparse.Namespace, settings: Settings) -> int:
    status = server_from_settings(settings).status()
    if args.json:
        print(status.model_dump_json())
    else:
        state = "running" if status.running else "not running"
        print(f"llama-server {state} at {status.base_url} pid={status.pid} slots={status.slots}")
    return 0 if status.running or not args.check else 3


def _server_smoke(args: argparse.Namespace, settings: Settings) -> int:
    from kimi_batch.llama import smoke_from_settings

    result = smoke_from_settings(settings, timeout_s=args.timeout)
    if args.json:
        print(result.model_dump_json())
    else:
        print(
            f"llama-server smoke test passed: {result.binary} loaded the demo model in "
            f"{result.load_s:.1f} s and answered {result.completion_tokens} tokens "
            f"({result.wall_s:.1f} s in all)"
        )
    return 0


def _server_stop(args: argparse.Namespace, settings: Settings) -> int:
    stopped = server_from_settings(settings).stop()
    print("stopped llama-server" if stopped else "no llama-server was running")
    return 0


def _demo(args: argparse.Namespace, settings: Settings) -> int:
    from kimi_batch.cli.demo import run_demo
    from kimi_batch.cli.progress_bar import BatchProgressBar, wants_bar
    from kimi_batch.engine import listening

    if wants_bar() and not args.verbose:
        with BatchProgressBar() as bar, listening(bar):
            summary = run_demo(settings, console_log_level="WARNING")
    else:
        summary = run_demo(settings)
    print(json.dumps(summary, sort_keys=True))
    return 0


def _export(args: argparse.Namespace, settings: Settings) -> int:
    from kimi_batch.cli.export import export_partition

    path = export_partition(
        settings, ds=args.date, source=args.source, fmt=args.format, out=args.out
    )
    print(path)
    return 0


def _api(args: argparse.Namespace, settings: Settings) -> int:
    from kimi_batch.api import serve

    serve(settings, host=args.host, port=args.port)
    return 0


def _publish(args: argparse.Namespace, settings: Settings) -> int:
    from kimi_batch.cli.publish import publish_warehouse

    report = publish_warehouse(settings)
    print(json.dumps(dataclasses.asdict(report)))
    return 0


def _status(args: argparse.Namespace, settings: Settings) -> int:
    from kimi_batch.cli.status import collect_status, render_status

    status = collect_status(settings)
    print(status.model_dump_json(indent=2) if args.json else render_status(status))
    return 0


def _digest_lint(args: argparse.Namespace, settings: Settings | None) -> int:
    from kimi_batch.engine import lint_digest, load_digest

    try:
        text = load_digest(Path(args.file)).text
    except OSError as error:
        print(f"kimi-batch: error: cannot read {args.file}: {error.strerror}", file=sys.stderr)
        return 2
    findings = lint_digest(text, allow=args.allow)
    for finding in findings:
        print(finding)
    return 1 if findings else 0


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line (exit 2), like every expected failure."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kimi-batch", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    commands = parser.add_subparsers(dest="command", required=True)

    server = commands.add_parser("server", help="the resident llama-server").add_subparsers(
        dest="action", required=True
    )
    start = server.add_parser("start", help="start it, or attach when it already runs")
    start.add_argument("--json", action="store_true")
    start.add_argument("--load-timeout", type=float, default=None, help="seconds")
    start.set_defaults(func=_server_start)
    status = server.add_parser("status", help="is it running, with which spec")
    status.add_argument("--json", action="store_true")
    status.add_argument("--check", action="store_true", help="exit 3 when not running")
    status.set_defaults(func=_server_status)
    server.add_parser("stop", help="stop the server this state dir started").set_defaults(
        func=_server_stop
    )
    smoke = server.add_parser(
        "smoke",
        help="start the configured binary on the demo model, ask a few tokens, stop it "
        "(exit 2 naming the signal when it crashes)",
    )
    smoke.add_argument("--json", action="store_true")
    smoke.add_argument("--timeout", type=float, default=None, help="seconds (default 120)")
    smoke.set_defaults(func=_server_smoke)

    commands.add_parser("demo", help="run the whole pipeline once on the inbox").set_defaults(
        func=_demo
    )

    export = commands.add_parser("export", help="write a partition in another format")
    export.add_argument("--format", choices=["openai-batch"], default="openai-batch")
    export.add_argument("--date", required=True)
    export.add_argument("--source", required=True)
    export.add_argument("--out", default=None, help="output file (default: under the state dir)")
    export.set_defaults(func=_export)

    api = commands.add_parser("api", help="the OpenAI-compatible Batch API (files, batches)")
    api.add_argument("--host", default="127.0.0.1", help="non-loopback needs KIMI_BATCH_API_KEY")
    api.add_argument("--port", type=int, default=None, help="default KIMI_BATCH_API_PORT (8090)")
    api.set_defaults(func=_api)

    commands.add_parser("publish", help="register every Parquet partition in Trino").set_defaults(
        func=_publish
    )

    status_all = commands.add_parser(
        "status", help="server, ledger, partitions, nightly run and inbox on one screen"
    )
    status_all.add_argument("--json", action="store_true")
    status_all.set_defaults(func=_status)

    digest = commands.add_parser("digest", help="the system digest").add_subparsers(
        dest="action", required=True
    )
    lint = digest.add_parser(
        "lint", help="exit 1 with one 'line N: rule 'match'' per cache-breaking finding, 0 if clean"
    )
    lint.add_argument("file")
    lint.add_argument(
        "--allow", action="append", default=[], metavar="REGEX", help="accept matches of REGEX"
    )
    lint.set_defaults(func=_digest_lint, needs_settings=False)
    _add_perf_commands(commands)
    return parser


def _add_perf_commands(commands: Any) -> None:
    from kimi_batch.bench.commands import bench_command, plan_command, tune_command

    bench = commands.add_parser("bench", help="naive vs all-slots client vs engine vs Dagster")
    bench.add_argument("--json", default=None, help="also write the JSON (and .md, .png) here")
    bench.add_argument(
        "--workload",
        choices=["distill", "amplify", "both", "rewrite", "night", "rehearsal"],
        default="both",
    )
    bench.add_argument("--rows", type=int, default=24, help="distillation prompts")
    bench.add_argument("--output-tokens", type=int, default=64, help="distillation answer length")
    bench.add_argument("--seeds-per-slot", type=int, default=2, help="amplification seeds")
    bench.add_argument("--variants", type=int, default=3, help="variants per strategy and seed")
    bench.add_argument("--amplify-output-tokens", type=int, default=32)
    bench.add_argument("--no-dagster", action="store_true", help="skip contender (D)")
    bench.add_argument("--no-ceiling", action="store_true", help="skip llama-batched-bench")
    bench.add_argument("--rewrite-rows", type=int, default=20, help="copy-heavy rows (rewrite)")
    bench.add_argument("--partitions", type=int, default=None, help="night/rehearsal partitions")
    bench.add_argument("--rows-per-partition", type=int, default=None, help="night/rehearsal")
    bench.add_argument("--night-output-tokens", type=int, default=32, help="night: --n-predict")
    bench.add_argument("--rehearsal-rows", type=int, default=10_000, help="rehearsal: all rows")
    bench.add_argument("--time-scale", type=float, default=600.0, help="rehearsal: x target speed")
    bench.add_argument("--window-h", type=float, default=5.0, help="rehearsal: the night, hours")
    bench.add_argument("--rewrite-output-tokens", type=int, default=160)
    bench.add_argument(
        "--spec-type", default=None, help="rewrite: --spec-type (default KIMI_BATCH_LLAMA_SPEC)"
    )
    bench.set_defaults(func=bench_command)

    tune = commands.add_parser("tune", help="thread and slot sweeps; names the knees")
    tune.add_argument("--threads", type=int, nargs="+", default=None, help="default: 1..CPUs")
    tune.add_argument("--slots", type=int, nargs="+", default=[1, 2, 4, 8])
    tune.add_argument("--prompt-tokens", type=int, default=256)
    tune.add_argument("--output-tokens", type=int, default=64)
    tune.add_argument("--ctx-per-slot", type=int, default=2048)
    tune.add_argument("--repetitions", type=int, default=2)
    tune.add_argument("--json", default=None, help="also write the JSON (and .md, .png) here")
    tune.set_defaults(func=tune_command)

    plan = commands.add_parser("plan", help="time a partition needs; what fits the window")
    plan.add_argument("--prompt-tokens", type=int, required=True, help="evaluated, per row")
    plan.add_argument(
        "--output-tokens",
        type=int,
        default=None,
        help="generated, per row (default: the answer budget, KIMI_BATCH_LLAMA_N_PREDICT)",
    )
    plan.add_argument("--rows", type=int, required=True)
    plan.add_argument("--prompt-tok-s", type=float, default=None, help="per slot")
    plan.add_argument("--gen-tok-s", type=float, default=None, help="per slot")
    plan.add_argument("--slots", type=int, default=None)
    plan.add_argument("--window-h", type=float, default=8.0)
    plan.add_argument("--digest-tokens", type=int, default=0, help="a cold digest prefill")
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
        "--night-overhead-s", type=float, default=0.0, help="server idle once a night (run start)"
    )
    plan.add_argument(
        "--partition-overhead-s",
        type=float,
        default=0.0,
        help="server idle per partition of a night (lease, seeds)",
    )
    plan.add_argument("--json", action="store_true")
    plan.set_defaults(func=plan_command)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = logging.INFO if args.verbose else logging.WARNING
    # The level goes on the handler too: libraries that set their own logger to INFO (the trino
    # client) would otherwise print their retries next to our one-line error.
    handler = logging.StreamHandler()
    handler.setLevel(level)
    logging.basicConfig(
        level=level, handlers=[handler], format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        settings = Settings.from_env() if getattr(args, "needs_settings", True) else None
        return int(args.func(args, settings))
    except KimiBatchError as error:
        # Expected failures: the message is for the user; detail lines (a spec, a log tail) follow.
        print(f"kimi-batch: error: {error}", file=sys.stderr)
        return 2
