"""`kimi-batch`: manage the resident server and run the pipeline outside the UI.

`main` reads the environment once (`Settings.from_env`) and hands that `Settings` to the command;
`digest lint` needs none, so a bad `KIMI_BATCH_*` variable does not stop it. The help texts are
for users: what a command does for them, never the names inside (a test checks).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import re
import sys
from collections.abc import Sequence
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, cast

from kimi_batch.cli.bench_hook import add_bench_commands
from kimi_batch.cli.state import add_state_commands
from kimi_batch.cli.warehouse import add_warehouse_commands
from kimi_batch.errors import ConfigError, KimiBatchError
from kimi_batch.llama import server_from_settings, watched_server
from kimi_batch.settings import Settings

if TYPE_CHECKING:
    from kimi_batch.exports import SystemTurn

DESCRIPTION = """\
Batch inference on a model server you keep running: start the server once, run the pipeline on
your input files, see where the night stands, serve an OpenAI-compatible Batch API, and size a
night before you run it."""
EPILOG = """\
Configuration comes from KIMI_BATCH_* environment variables (state directory: KIMI_BATCH_HOME,
default ./var); every one is listed in docs/reference/environment.md. Run
'kimi-batch COMMAND --help' for a command's options."""
JSON_HELP = "print the result as one JSON object"


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
    manager, problem = watched_server(settings)
    status = manager.status()
    if problem is not None:
        print(f"kimi-batch: warning: a start would fail: {problem}", file=sys.stderr)
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
    stopped = watched_server(settings).manager.stop()
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
    from kimi_batch.cli.export import ExportRequest, run_export
    from kimi_batch.exports import CardOptions, ExportQuery, TrainingOptions

    if args.date and (args.since or args.until):
        raise ConfigError("--date is one day: use it without --since and --until")
    query = ExportQuery(
        since=args.date or args.since,
        until=args.date or args.until,
        source=args.source,
        min_judge_score=args.min_judge_score,
        include_batches=args.include_batches,
    )
    training = TrainingOptions(
        reasoning=args.reasoning,
        layout=args.layout,
        system_turn=_system_turn(args),
    )
    request = ExportRequest(
        fmt=args.format,
        out=args.out,
        query=query,
        system_files=tuple(value for value in args.system if isinstance(value, Path)),
        no_system=args.no_system,
        as_of=args.as_of,
        training=training,
        card=CardOptions(
            license=args.license,
            language=tuple(args.language),
            pretty_name=args.pretty_name,
        ),
        push_to_hub=args.push_to_hub,
    )
    print(run_export(settings, request))
    return 0


_SYSTEM_TURNS: tuple[SystemTurn, ...] = ("keep", "drop", "once")


def _system_option(value: str) -> str | Path:
    """`--system`: a way to write the system turn, or an older digest file."""
    return value if value in _SYSTEM_TURNS else Path(value)


def _system_turn(args: argparse.Namespace) -> SystemTurn:
    """The one way to write the system turn that `--system`, `--system-turn` and the older
    `--no-system` (= drop) ask for; two different ones are refused."""
    asked = {value for value in args.system if isinstance(value, str)}
    if args.system_turn is not None:
        asked.add(args.system_turn)
    if args.no_system:
        asked.add("drop")
    if len(asked) > 1:
        raise ConfigError(f"the system turn asked two ways: {' and '.join(sorted(asked))}")
    # Each value asked is one of _SYSTEM_TURNS (argparse's choices, `_system_option`).
    return cast("SystemTurn", asked.pop()) if asked else "keep"


def _day(value: str) -> date:
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a day YYYY-MM-DD: {value!r}") from None


def _port(value: str) -> int:
    if not (value.isascii() and value.isdigit()) or not 1 <= int(value) <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 1 to 65535, not {value!r}")
    return int(value)


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds < math.inf:
        raise argparse.ArgumentTypeError(f"a number of seconds above 0, not {value!r}")
    return seconds


def _regex(value: str) -> str:
    try:
        re.compile(value)
    except re.error as error:
        raise argparse.ArgumentTypeError(f"not a regular expression: {value!r} ({error})") from None
    return value


def _score(value: str) -> int:
    if not (value.isascii() and value.isdigit()) or not 1 <= int(value) <= 10:
        raise argparse.ArgumentTypeError(f"a judge score is 1 to 10, not {value!r}")
    return int(value)


def _add_export(commands: argparse._SubParsersAction[_Parser]) -> None:
    export = commands.add_parser(
        "export",
        help="write the answers for training, or as OpenAI Batch output lines",
        description="Write the teacher's answers (every day and source unless you narrow "
        "them) in a trainer's format, or as OpenAI Batch API output lines, and print the "
        "path. Training formats: chat (JSONL of system, user and assistant messages), hf "
        "(a Hugging Face dataset folder with its card), kd (chat plus each answer token's "
        "id, logprob and top-k alternatives). Batch API batches are left out of them unless "
        "--source names one or --include-batches asks for them.",
    )
    export.add_argument(
        "--format",
        choices=["openai-batch", "chat", "hf", "kd"],
        default="openai-batch",
        help="what to write (default: openai-batch)",
    )
    export.add_argument("--since", type=_day, metavar="D", help="first day to export, YYYY-MM-DD")
    export.add_argument("--until", type=_day, metavar="D", help="last day to export, YYYY-MM-DD")
    export.add_argument("--date", type=_day, metavar="D", help="one day only, YYYY-MM-DD")
    export.add_argument(
        "--source", default=None, metavar="S", help="one source only: the input file's stem"
    )
    export.add_argument(
        "--min-judge-score",
        type=_score,
        metavar="N",
        help="keep only answers the judge scored N (1-10) or more",
    )
    export.add_argument(
        "--system",
        action="append",
        type=_system_option,
        default=[],
        metavar="keep|drop|once|FILE",
        help="the system digest: keep, drop or once (as --system-turn); or an older digest "
        "FILE, for answers generated under it (repeatable; ./keep is a file named keep)",
    )
    export.add_argument("--no-system", action="store_true", help="the same as --system drop")
    _add_training_shape(export)
    export.add_argument(
        "--as-of",
        default=None,
        metavar="SNAPSHOT|TAG|DATE",
        help="export the tables as they were: a table's snapshot id, a night's tag "
        "(night-YYYY-MM-DD), or a day (its end, UTC) or date-time (default: as they are now)",
    )
    export.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="PATH",
        help="the output file, or folder for hf (default: under the state directory)",
    )
    _add_card_options(export)
    export.set_defaults(func=_export)


def _add_training_shape(export: _Parser) -> None:
    """The chat rows' shape (kimi_batch/exports/shape.py)."""
    export.add_argument(
        "--reasoning",
        choices=["field", "inline", "drop"],
        default="field",
        help="the teacher's reasoning: the assistant's reasoning_content (default), inside "
        "<think> tags in its content, or left out",
    )
    export.add_argument(
        "--layout",
        choices=["messages", "prompt-completion"],
        default="messages",
        help="TRL's conversational rows (messages, default) or prompt/completion pairs",
    )
    export.add_argument(
        "--system-turn",
        choices=_SYSTEM_TURNS,
        default=None,
        help="the system digest: in every row (default), left out, or written once in "
        "<out>.system.json with each row naming its sha256 (system_sha256)",
    )
    export.add_argument(
        "--include-batches",
        action="store_true",
        help="training formats: include Batch API batches' answers (with their tools)",
    )


def _add_card_options(export: argparse.ArgumentParser) -> None:
    """What an hf export's dataset card declares, and where the folder may go."""
    card = export.add_argument_group("hf dataset card")
    card.add_argument(
        "--license",
        default="other",
        metavar="ID",
        help="the card's license (default: other, the teacher model's license governs)",
    )
    card.add_argument(
        "--language",
        action="append",
        default=[],
        metavar="CODE",
        help="a language of the rows, an ISO 639 code (repeatable; default: guessed by script)",
    )
    card.add_argument(
        "--pretty-name", default=None, metavar="NAME", help="the dataset's display name"
    )
    card.add_argument(
        "--push-to-hub",
        default=None,
        metavar="REPO",
        help="also upload the folder to this Hugging Face dataset repository (private when "
        "created; needs HF_TOKEN or hf auth login)",
    )


def _api(args: argparse.Namespace, settings: Settings) -> int:
    from kimi_batch.batch_api.web import serve

    serve(settings, host=args.host, port=args.port, no_auth=args.no_auth, launch=not args.no_launch)
    return 0


def _publish(args: argparse.Namespace, settings: Settings) -> int:
    from kimi_batch.cli.publish import publish_catalog

    print(publish_catalog(settings, args.output))
    return 0


def _status(args: argparse.Namespace, settings: Settings) -> int:
    from kimi_batch.cli.status import collect_status
    from kimi_batch.cli.status_sections import render_status

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
    except ConfigError as error:
        print(f"kimi-batch: error: {error}", file=sys.stderr)
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
    parser = _Parser(
        prog="kimi-batch",
        description=DESCRIPTION,
        epilog=EPILOG,
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="also print progress and informational logs"
    )
    commands = parser.add_subparsers(
        dest="command", required=True, title="commands", metavar="COMMAND"
    )

    server = commands.add_parser(
        "server",
        help="start, check or stop the model server (llama-server)",
        description="The model server stays up between runs: start it once, and every command "
        "and run uses it.",
    ).add_subparsers(dest="action", required=True, title="commands", metavar="COMMAND")
    start = server.add_parser(
        "start",
        help="start the model server, or report the one already running",
        description="Start llama-server with your model in the background and wait until it "
        "answers (a large model takes minutes to load). When it already runs with the same "
        "settings, report it; with other settings, refuse and name both.",
    )
    start.add_argument("--json", action="store_true", help=JSON_HELP)
    start.add_argument(
        "--load-timeout",
        type=_seconds,
        default=None,
        metavar="SECONDS",
        help="how long the model load may take (default: KIMI_BATCH_LLAMA_LOAD_TIMEOUT_S)",
    )
    start.set_defaults(func=_server_start)
    status = server.add_parser(
        "status",
        help="is the model server running: its address, process, model and slots",
        description="Say whether the model server runs, where, with which model and slots.",
    )
    status.add_argument("--json", action="store_true", help=JSON_HELP)
    status.add_argument("--check", action="store_true", help="exit 3 when it is not running")
    status.set_defaults(func=_server_status)
    server.add_parser(
        "stop",
        help="stop the model server started from this state directory",
        description="Stop the model server that 'kimi-batch server start' started here.",
    ).set_defaults(func=_server_stop)
    smoke = server.add_parser(
        "smoke",
        help="check that the llama-server binary runs on this machine",
        description="Start the configured llama-server on the small demo model, ask for a few "
        "tokens and stop it, in seconds. A binary this CPU cannot run fails with one line "
        "naming the signal (exit 2).",
    )
    smoke.add_argument("--json", action="store_true", help=JSON_HELP)
    smoke.add_argument(
        "--timeout", type=float, default=None, metavar="SECONDS", help="give up after (120)"
    )
    smoke.set_defaults(func=_server_smoke)

    commands.add_parser(
        "demo",
        help="run the whole pipeline once on the inbox and print a summary",
        description="Run the whole pipeline once on the files in the inbox (sample files when "
        "it is empty): the digest, every partition's variants and answers, the tables. Ends "
        "with one JSON line of counts and speeds.",
    ).set_defaults(func=_demo)

    _add_export(commands)

    api = commands.add_parser(
        "api",
        help="serve the OpenAI-compatible Batch API for the openai client",
        description="Serve OpenAI's Batch API (files and batches) over the pipeline: code "
        "written for OpenAI's batches runs unchanged, and each batch is run and kept like any "
        "input. Every request needs the key: KIMI_BATCH_API_KEY, or the one created at the "
        "first start (its file is printed). With no Dagster daemon serving the instance "
        "(DAGSTER_HOME, else the state directory's), it runs the batches itself.",
    )
    api.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1)",
    )
    api.add_argument(
        "--port", type=_port, default=None, help="port (default: KIMI_BATCH_API_PORT, 8090)"
    )
    api.add_argument(
        "--no-auth",
        action="store_true",
        help="serve without a key (loopback only): every local user can then read every batch",
    )
    api.add_argument(
        "--no-launch",
        action="store_true",
        help="never run batches here: leave them to a Dagster daemon (make dev, a deployment)",
    )
    api.set_defaults(func=_api)

    publish = commands.add_parser(
        "publish",
        help="the Trino catalog file that reads this deployment's Iceberg tables",
        description="Print (secrets masked) or write the Iceberg catalog file a Trino needs to "
        "read the warehouse's tables; every commit is visible to Trino's next query.",
    )
    publish.add_argument(
        "--output",
        type=Path,
        default=None,
        help="write the file here, owner-only (e.g. etc/catalog/iceberg.properties)",
    )
    publish.set_defaults(func=_publish)

    status_all = commands.add_parser(
        "status",
        help="where everything stands: server, finished rows, partitions, last night, inbox, "
        "answers kept out of training",
        description="One screen: the model server, the rows finished per table, the partitions "
        "done, pending, failed or stale, the last night's run, the inbox, the answers set "
        "aside as duplicates or benchmark overlaps, and each table's newest snapshot with its "
        "night tag. Reads only; changes nothing.",
    )
    status_all.add_argument("--json", action="store_true", help=JSON_HELP)
    status_all.set_defaults(func=_status)

    digest = commands.add_parser(
        "digest",
        help="check the system digest (the fixed system prompt)",
        description="The digest is the system prompt every request starts with; it is "
        "computed once and reused, so it must never change from one request to the next.",
    ).add_subparsers(dest="action", required=True, title="commands", metavar="COMMAND")
    lint = digest.add_parser(
        "lint",
        help="find what would break the prompt cache in a digest (dates, ids, 'today')",
        description="Print one 'line N: rule 'match'' per finding and exit 1, or exit 0 when "
        "the digest is clean (fits pre-commit and CI).",
    )
    lint.add_argument("file", help="the digest file")
    lint.add_argument(
        "--allow",
        action="append",
        type=_regex,
        default=[],
        metavar="REGEX",
        help="accept matches of REGEX",
    )
    lint.set_defaults(func=_digest_lint, needs_settings=False)
    add_state_commands(commands)
    add_warehouse_commands(commands)
    add_bench_commands(commands, json_help=JSON_HELP)
    return parser


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
