"""`kimi-batch export`: distilled answers as OpenAI Batch output lines, or in a trainer's format.

    openai-batch  OpenAI Batch API output lines (the Batch API's own writer, batch_api.lines):
                  one for each answer, and an error line for each request set aside or failed by
                  the stage that answered (distill's quarantine rows; a Batch API batch's `api`)
    chat          JSONL of {"messages": [system, user, assistant]} (TRL's SFTTrainer, axolotl),
                  shaped by --reasoning, --layout and --system (exports/shape.py)
    hf            a folder datasets.load_dataset loads, with its dataset card (exports/hf.py)
    kd            default chat lines plus the answer's tokens: id, logprob, top-k (exports/kd.py)

Every partition of `distilled` unless `--since`/`--until`/`--source` narrow it (`exports/
selection.py`); the training formats leave Batch API batches out unless `--source` names one
or `--include-batches` asks for them.
Files hold prompts and answers: written 0600 whole (temp, fsync, rename), the folders created
0700 (the default `$KIMI_BATCH_HOME/exports` always), a killed export's temps removed by the next.
An `--out` that cannot be written is found before anything is read (one line, exit 2).

An export reads one snapshot of each table (`pinned_warehouse`): the current ones, or those
`--as-of SNAPSHOT|TAG|DATE` names (`warehouse.resolve_as_of`), so the same as-of writes the same
bytes a year later; the hf card lists the snapshot ids.

An `openai-batch` export of one partition keeps each line's `custom_id` (a seed's input id, a
variant's `seed_id:strategy:variant_id`); one of several partitions prefixes each with
`ds/source/` (`partition_prefix`), since input ids repeat across partitions and a batch output
file's `custom_id`s are unique.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import date
from pathlib import Path
from typing import Any, TextIO

from pydantic import BaseModel, ConfigDict

from kimi_batch.batch_api import AnsweredRequest, error_line, response_line
from kimi_batch.crash_points import crash_point
from kimi_batch.engine import load_digest
from kimi_batch.errors import ConfigError, MissingInputError
from kimi_batch.exports import (
    BuildExamples,
    CardOptions,
    ExportExample,
    ExportQuery,
    PartitionRows,
    SystemTexts,
    TokenizerIdentity,
    TrainingOptions,
    example_builder,
    kd_line,
    push_to_hub,
    read_selection,
    select_partitions,
    system_side_file,
    tokenizer_identity,
    write_hf,
)
from kimi_batch.llama import TokenLogprob, ToolCall
from kimi_batch.paths import private_dir
from kimi_batch.pipeline import AMPLIFY, DISTILL, STAGES
from kimi_batch.settings import Settings
from kimi_batch.storage import private_folder, private_writer, temp_name
from kimi_batch.warehouse import (
    Warehouse,
    current_snapshots,
    open_warehouse,
    resolve_as_of,
    validate_ds,
    validate_source,
)

FORMATS = ("openai-batch", "chat", "hf", "kd")
TRAINING_FORMATS = ("chat", "hf", "kd")


def export_custom_id(input_id: str, variant: tuple[str, str] | None) -> str:
    """The input row's id for a seed (an OpenAI Batch user joins on it as usual), and
    `seed_id:strategy:variant_id` for a generated variant: answered or set aside alike."""
    if variant is None:
        return input_id
    seed_id, strategy = variant
    return f"{seed_id}:{strategy}:{input_id}"


def _answer(row: dict[str, Any], prefix: str = "") -> AnsweredRequest:
    variant = None if row["origin"] == "seed" else (row["seed_id"], row["strategy"])
    logprobs = row.get("logprobs")
    calls = row.get("tool_calls")
    return AnsweredRequest(
        custom_id=prefix + export_custom_id(row["input_id"], variant),
        request_id=row["request_id"],
        model=row["model"],
        created_at=row["created_at"],
        content=row["response"],
        reasoning=row.get("reasoning"),
        logprobs=[TokenLogprob.model_validate(t) for t in logprobs] if logprobs else None,
        tool_calls=[ToolCall.model_validate(c) for c in json.loads(calls)] if calls else None,
        finish_reason=row["finish_reason"],
        prompt_tokens=row["prompt_tokens"],
        completion_tokens=row["completion_tokens"],
        cached_tokens=row["cached_tokens"],
    )


def openai_batch_lines(
    distilled: list[dict[str, Any]],
    quarantined: list[dict[str, Any]],
    variants: dict[str, tuple[str, str]] | None = None,
    *,
    prefix: str = "",
) -> list[str]:
    """One line per answer (`response`) and per failed request of the stage that answers
    (`error`: distill's, or a Batch API batch's).

    `variants`: variant request id -> (seed_id, strategy), from the `amplified` table, so a
    set-aside variant gets the same `custom_id` its answer would have had. `prefix` goes in
    front of every `custom_id` (the partition's, in an export of several).
    """
    lines = [response_line(_answer(row, prefix)) for row in distilled]
    for row in quarantined:
        input_id = row["input_id"] or ""
        lines.append(
            error_line(
                custom_id=prefix + export_custom_id(input_id, (variants or {}).get(input_id)),
                request_id=row["request_id"],
                code="quarantined",
                message=row["reason"],
            )
        )
    return lines


class ExportRequest(BaseModel):
    """What `kimi-batch export` was asked for."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fmt: str = "openai-batch"
    out: Path | None = None
    query: ExportQuery = ExportQuery()
    system_files: tuple[Path, ...] = ()
    no_system: bool = False
    as_of: str | None = None  # a snapshot id, a tag (night-YYYY-MM-DD), a date or a date-time
    training: TrainingOptions = TrainingOptions()
    card: CardOptions = CardOptions()
    push_to_hub: str | None = None


def _default_path(settings: Settings, request: ExportRequest) -> Path:
    query = request.query
    if query.single:
        stem = f"distilled-{query.since}-{query.source}"
    elif query.since is None and query.until is None:
        stem = "distilled-all" + (f"-{query.source}" if query.source else "")
    else:
        span = f"{query.since or 'first'}..{query.until or 'last'}"
        stem = f"distilled-{span}" + (f"-{query.source}" if query.source else "")
    suffix = {"openai-batch": ".jsonl", "chat": ".chat.jsonl", "kd": ".kd.jsonl", "hf": ".hf"}
    # Ours: made owner-only even when an older version created it 0755.
    return private_dir(settings.paths.exports_dir) / (stem + suffix[request.fmt])


def partition_prefix(ds: str, source: str) -> str:
    """What an export of several partitions puts in front of each `custom_id`: input ids repeat
    across partitions, and a batch output file's `custom_id`s are unique (`ds/source/`: neither
    holds a `/`)."""
    return f"{ds}/{source}/"


def _answering_stages() -> frozenset[str]:
    """The stages whose rows are `distilled` rows, from the stage registry: the distillation's
    (inbox partitions) and the Batch API's (`api`, batch partitions). Their quarantine rows are
    the failed requests an `openai-batch` export gives error lines; the input stage's, the
    amplification's and the judge's are not requests of the answers."""
    return frozenset(name for name, task in STAGES.items() if task.table == DISTILL.table)


def _openai_batch(warehouse: Warehouse, ds: str, source: str, prefix: str) -> list[str]:
    distilled = warehouse.read_partition(DISTILL.table, ds, source)
    quarantine = warehouse.read_partition("quarantine", ds, source)
    # One stage writes a partition's `distilled` rows (distill, or a batch's `api`): its
    # set-aside and failed requests are the partition's error lines.
    failed = quarantine.filter(quarantine["stage"].is_in(sorted(_answering_stages())))
    amplified = warehouse.read_partition(AMPLIFY.table, ds, source)
    variants = {
        row["request_id"]: (row["seed_id"], row["strategy"]) for row in amplified.to_dicts()
    }
    return openai_batch_lines(distilled.to_dicts(), failed.to_dicts(), variants, prefix=prefix)


def _system_texts(settings: Settings, request: ExportRequest) -> SystemTexts:
    paths = [settings.digest, *request.system_files]
    missing = [path for path in paths if not path.is_file()]
    # `--no-system` is `--system drop`: neither needs the digest's text.
    omit = request.no_system or request.training.system_turn == "drop"
    if missing and not omit:
        raise MissingInputError(f"system digest file {missing[0]} does not exist")
    return SystemTexts([load_digest(p) for p in paths if p.is_file()], omit=omit)


def _kd_line(example: ExportExample, tokenizer: TokenizerIdentity | None) -> str:
    logprobs = example.logprobs or []
    # A model file of another vocabulary than the answers' (a server attached by URL) names
    # no tokenizer rather than a wrong one.
    top_id = max((t.id for t in logprobs if t.id is not None), default=-1)
    if tokenizer is not None and top_id >= tokenizer.vocab_size:
        tokenizer = None
    return kd_line(
        # The default chat row: the answer's reasoning_content and tool_calls and the request's
        # tools; the positions cover the reasoning too, so the shape options stay chat's and hf's.
        chat=json.loads(example.chat_line()),
        request_id=example.request_id,
        model=example.model,
        logprobs=logprobs,
        tokenizer=tokenizer,
    )


def _write_lines(
    writer: TextIO,
    request: ExportRequest,
    selection: Iterable[PartitionRows],
    build: BuildExamples,
    digests: dict[str, str],
    model: Path | None,
) -> int:
    """The lines of every partition; `digests` gathers each system text by sha256 (for
    `--system once`'s side file); `model`: the GGUF a kd row's tokenizer is read from."""
    fmt, written = request.fmt, 0
    tokenizer = tokenizer_identity(model) if fmt == "kd" and model and model.is_file() else None
    for rows in selection:
        built = build(rows)
        if fmt == "kd":
            bare = [example.request_id for example in built if not example.logprobs]
            if bare:
                raise MissingInputError(
                    f"{len(bare)} of {len(built)} answers of ds={rows.ds} source={rows.source} "
                    "have no logprobs: --format kd needs answers distilled with n_probs above 0 "
                    "(narrow the export with --since/--until/--source)"
                )
        for example in built:
            digests[example.digest_sha256] = example.system_text
            if fmt == "kd":
                line = _kd_line(example, tokenizer)
            else:
                line = example.chat_line(request.training)
            writer.write(line + "\n")
        written += len(built)
    return written


def _check_writable(path: Path, *, folder: bool) -> None:
    """ConfigError (one line, exit 2) when the export could not be written at `path`: found
    before the partitions are read, not as a traceback after."""
    if not folder and path.is_dir():
        raise ConfigError(f"cannot write the export to {path}: it is a folder")
    try:
        parent = private_folder(path.parent)
        probe = temp_name(parent, path.name)
        probe.touch(mode=0o600, exist_ok=False)
        probe.unlink()
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise ConfigError(f"cannot write the export to {path}: {reason}") from error


def pinned_warehouse(settings: Settings, as_of: str | None) -> Warehouse:
    """The tables as of `as_of` (None: their current snapshots), pinned: the export reads one
    state throughout, even while a night commits, and its card names it."""
    warehouse = open_warehouse(settings)
    if as_of is None:
        return warehouse.pinned(current_snapshots(warehouse))
    return warehouse.pinned(resolve_as_of(warehouse, as_of, required=DISTILL.table))


def run_export(settings: Settings, request: ExportRequest) -> Path:
    """Write the export; returns its path (a file, or the hf folder)."""
    if request.fmt not in FORMATS:
        raise ConfigError(f"unknown export format {request.fmt!r}")
    # A license or language the Hub does not know: refused here, not by the Hub at the upload.
    request = request.model_copy(update={"card": request.card.check()})
    query = request.query.check()
    if query.min_judge_score is not None and request.fmt not in TRAINING_FORMATS:
        raise ConfigError("--min-judge-score chooses training rows: use it with chat, hf or kd")
    # --system drop (--no-system) only leaves the digest out, which kd rows can too.
    plain = (TrainingOptions(), TrainingOptions(system_turn="drop"))
    if request.training not in plain and request.fmt not in ("chat", "hf"):
        raise ConfigError(
            "--reasoning, --layout and --system once shape chat and hf rows, not kd's"
        )
    if request.push_to_hub and request.fmt != "hf":
        raise ConfigError("--push-to-hub uploads a dataset folder: use it with --format hf")
    warehouse = pinned_warehouse(settings, request.as_of)
    training = request.fmt in TRAINING_FORMATS
    partitions = select_partitions(warehouse, query, training=training)
    path = request.out or _default_path(settings, request)
    _check_writable(path, folder=request.fmt == "hf")
    if not training:
        several = len(partitions) > 1  # one partition keeps its ids: a client joins on them
        with private_writer(path) as writer:
            for ds, source in partitions:
                prefix = partition_prefix(ds, source) if several else ""
                lines = _openai_batch(warehouse, ds, source, prefix)
                writer.writelines(line + "\n" for line in lines)
        return path
    build = example_builder(settings, _system_texts(settings, request))
    selection = read_selection(warehouse, query, partitions)
    if request.fmt == "hf":
        write_hf(settings, warehouse, path, query, selection, build, request.training, request.card)
        if request.push_to_hub:
            print(f"pushed to {push_to_hub(path, request.push_to_hub)}")
        return path
    digests: dict[str, str] = {}
    with private_writer(path) as writer:
        if not _write_lines(writer, request, selection, build, digests, settings.model):
            raise MissingInputError(f"no rows to export in {query.describe()}")
        if request.training.system_turn == "once":
            # Inside the block: the side file is in place before the rows naming it appear.
            _write_system_side_file(path, digests)
    return path


def _write_system_side_file(path: Path, digests: dict[str, str]) -> None:
    """`--system once`: each system text once, by the sha256 the rows carry. An earlier
    side file's digests are kept (a sha names one text for good): written before the rows,
    a kill between the two leaves the older rows' digests in it."""
    side = system_side_file(path)
    earlier: dict[str, str] = {}
    if side.is_file():
        try:
            earlier = dict(json.loads(side.read_text(encoding="utf-8")))
        except (ValueError, TypeError):
            earlier = {}  # not ours (or damaged): the rows written next need only theirs
    with private_writer(side) as writer:
        merged = {**earlier, **digests}
        writer.write(json.dumps(merged, ensure_ascii=False, indent=1, sort_keys=True) + "\n")
    crash_point("export.system_side_file")  # the rows naming it are renamed in next


def export_partition(
    settings: Settings, *, ds: str, source: str, fmt: str, out: str | None
) -> Path:
    """One partition (`--date D --source S`), as `run_export` writes it."""
    day = date.fromisoformat(validate_ds(ds))
    query = ExportQuery(since=day, until=day, source=validate_source(source))
    return run_export(settings, ExportRequest(fmt=fmt, out=Path(out) if out else None, query=query))
