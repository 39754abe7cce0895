"""`--format hf`: a folder `datasets.load_dataset("parquet", data_dir=...)` (or
`load_dataset(folder)`) loads: `data/train-NNNNN.parquet`, one file a partition, and the card.

    <out>/README.md                    the dataset card (kimi_batch/exports/card.py)
    <out>/data/train-00000.parquet     messages (or prompt + completion), tools, ids, model,
                                       tokens, judge score (shaped by exports/shape.py)
    <out>/system.json                  `--system once`: the digests by sha256

The folder is filled as a hidden temp folder beside `<out>` and renamed over it at the end, so
an export that fails or is killed midway leaves the older export (or nothing) in place.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import polars as pl

from kimi_batch.errors import ConfigError, MissingInputError
from kimi_batch.exports.card import (
    CardFigures,
    CardOptions,
    DedupFigures,
    InputSource,
    SamplingFigures,
    TokenStats,
    build_card,
    quarantine_counts,
)
from kimi_batch.exports.conversation import BuildExamples, ExportExample
from kimi_batch.exports.language import DETECTION_NOTE, ScriptCounter
from kimi_batch.exports.selection import ExportQuery, PartitionRows
from kimi_batch.exports.shape import TrainingOptions
from kimi_batch.inputs import landed_versions
from kimi_batch.paths import PRIVATE_FILE_MODE
from kimi_batch.settings import Settings
from kimi_batch.storage import private_folder_swap
from kimi_batch.warehouse import Warehouse

CARD = "README.md"
DATA = "data"
HF_SCHEMA = pl.Schema(
    {
        "messages": pl.List(pl.Struct({"role": pl.String, "content": pl.String})),
        "ds": pl.String,
        "source": pl.String,
        "request_id": pl.String,
        "input_id": pl.String,
        "seed_id": pl.String,
        "origin": pl.String,
        "strategy": pl.String,
        "model": pl.String,
        "digest_sha256": pl.String,
        "input_sha256": pl.String,
        "prompt_tokens": pl.Int64,
        "cached_tokens": pl.Int64,
        "completion_tokens": pl.Int64,
        "finish_reason": pl.String,
        "judge_score": pl.Int64,
    }
)


# A message as the shape options write it (exports/shape.py); Parquet holds one struct for all,
# a key a message lacks reads as null.
_MESSAGE = pl.Struct(
    {
        "role": pl.String,
        "content": pl.String,
        "reasoning_content": pl.String,
        "tool_calls": pl.List(
            pl.Struct(
                {
                    "id": pl.String,
                    "type": pl.String,
                    "function": pl.Struct({"name": pl.String, "arguments": pl.String}),
                }
            )
        ),
    }
)
SYSTEM_FILE = "system.json"


def hf_schema(options: TrainingOptions) -> pl.Schema:
    """The Parquet columns of an export shaped by `options`: the conversation (`messages`, or
    `prompt` and `completion`), `tools` as OpenAI's JSON text (one column type for every row's
    tools), `system_sha256` with `--system once`, then the ids and figures."""
    conversation = (
        {"messages": pl.List(_MESSAGE)}
        if options.layout == "messages"
        else {"prompt": pl.List(_MESSAGE), "completion": pl.List(_MESSAGE)}
    )
    once = {"system_sha256": pl.String} if options.system_turn == "once" else {}
    rest = {name: dtype for name, dtype in HF_SCHEMA.items() if name != "messages"}
    return pl.Schema({**conversation, "tools": pl.String, **once, **rest})


class _Tally:
    """What the card says, gathered one partition at a time."""

    def __init__(self) -> None:
        self.examples = 0
        self.models: set[str] = set()
        self.digests: set[str] = set()
        self.prompt: list[int] = []
        self.completion: list[int] = []
        self.inputs: dict[tuple[str, str], tuple[set[str], int]] = {}
        self.files: dict[tuple[str, str], str] = {}
        self.judged = self.unjudged = self.below = self.top_k = 0
        self.scores: dict[int, int] = {}
        self.systems: dict[str, str] = {}
        self.scripts = ScriptCounter()

    def add(self, rows: PartitionRows, built: list[ExportExample]) -> None:
        self.examples += len(built)
        for example in built:
            self.models.add(example.model)
            self.digests.add(example.digest_sha256)
            self.systems[example.digest_sha256] = example.system_text
            self.prompt.append(example.prompt_tokens)
            self.completion.append(example.completion_tokens)
            if example.judge_score is not None:
                self.judged += 1
                self.scores[example.judge_score] = self.scores.get(example.judge_score, 0) + 1
            for token in example.logprobs or []:
                self.top_k = max(self.top_k, len(token.top))
            # The user side and the answer: the digest is one text, not the rows' language.
            self.scripts.add(turn.content for turn in example.messages if turn.role != "system")
        shas = {example.input_sha256 for example in built if example.input_sha256}
        self.inputs[(rows.ds, rows.source)] = (shas, len(built))
        first = next(iter(rows.seeds.values()), None)
        if first is not None:
            self.files[(rows.ds, rows.source)] = first.source_file
        self.unjudged += rows.unjudged_dropped
        self.below += rows.below_floor


def _record(example: ExportExample, options: TrainingOptions) -> dict[str, object]:
    row = example.trainer_row(options)
    tools = row.pop("tools", None)
    # logprobs excluded: kd has them
    # Text as written (non-ASCII kept), as the chat export writes it.
    tools_text = json.dumps(tools, ensure_ascii=False) if tools else None
    return {**example.model_dump(), **row, "tools": tools_text}


def _write_part(
    folder: Path, index: int, built: list[ExportExample], options: TrainingOptions
) -> None:
    records = [_record(example, options) for example in built]
    path = folder / f"train-{index:05d}.parquet"
    frame = pl.DataFrame(records, schema=hf_schema(options), strict=False)
    frame.write_parquet(path, compression="zstd")
    path.chmod(PRIVATE_FILE_MODE)


def _sources(settings: Settings, tally: _Tally) -> list[InputSource]:
    landed = {(a.ds, a.source): (a.name, sha) for a, sha in landed_versions(settings.paths)}
    sources: list[InputSource] = []
    for key, (shas, count) in sorted(tally.inputs.items()):
        name, latest = landed.get(key, (None, None))
        sources.append(
            InputSource(
                ds=key[0],
                source=key[1],
                file=name or tally.files.get(key),
                input_sha256=sorted(shas),
                latest_sha256=latest,
                rows=count,
            )
        )
    return sources


def _sampling(settings: Settings, warehouse: Warehouse, tally: _Tally) -> SamplingFigures:
    # The distillation run config's defaults: rows do not record the params they were sent with.
    from kimi_batch.pipeline import DistillConfig

    params = DistillConfig().sampling(settings.llama_n_predict)
    overrides = 0
    for ds, source in tally.inputs:
        seeds = warehouse.read_partition("seeds", ds, source)
        fields = ("max_tokens", "temperature", "top_p", "seed")
        overrides += seeds.filter(pl.any_horizontal(pl.col(f).is_not_null() for f in fields)).height
    return SamplingFigures(
        recorded=False,
        params=params.model_dump(include={"max_tokens", "temperature", "top_p", "seed"}),
        top_k_logprobs=tally.top_k,
        rows_with_overrides=overrides,
        note="The rows do not record the sampling they were generated with: these are the "
        "distillation run config's defaults (max_tokens: KIMI_BATCH_LLAMA_N_PREDICT), which a "
        "run's config or a seed's own fields may have changed.",
    )


def _quarantine(warehouse: Warehouse, tally: _Tally) -> dict[str, int]:
    reasons: list[str] = []
    for ds, source in tally.inputs:
        reasons.extend(warehouse.read_partition("quarantine", ds, source)["reason"].to_list())
    return quarantine_counts(reasons)


def _card(
    settings: Settings, warehouse: Warehouse, query: ExportQuery, tally: _Tally
) -> CardFigures:
    return CardFigures(
        rows=tally.examples,
        snapshots=dict(sorted((warehouse.snapshots or {}).items())),
        models=sorted(tally.models),
        digest_sha256=sorted(tally.digests),
        sources=_sources(settings, tally),
        sampling=_sampling(settings, warehouse, tally),
        quarantine=_quarantine(warehouse, tally),
        quality=DedupFigures(
            dedup=settings.dedup,
            dedup_fields=settings.dedup_fields,
            dedup_threshold=settings.dedup_threshold,
            dedup_shingle=settings.dedup_shingle,
            benchmarks=[path.name for path in settings.benchmarks],
            contamination_ngram=settings.contamination_ngram,
        ),
        prompt_tokens=TokenStats.of(tally.prompt),
        completion_tokens=TokenStats.of(tally.completion),
        min_judge_score=query.min_judge_score,
        judged_rows=tally.judged,
        judge_scores=tally.scores,
        dropped_unjudged=tally.unjudged,
        dropped_below_score=tally.below,
        languages=tally.scripts.languages(),
        languages_note=DETECTION_NOTE,
    )


def _write_systems(path: Path, systems: dict[str, str]) -> None:
    """`--system once`: each system text once, by the sha256 the rows carry."""
    path.write_text(json.dumps(systems, ensure_ascii=False, indent=1, sort_keys=True) + "\n")
    path.chmod(PRIVATE_FILE_MODE)


def _refuse_foreign(path: Path) -> None:
    """Only an earlier export (its card inside) is replaced, never a folder of the user's."""
    if path.exists() and not (path.is_dir() and (path / CARD).is_file() and (path / DATA).is_dir()):
        raise ConfigError(f"{path} exists and is not an earlier hf export: choose another --out")


def write_hf(
    settings: Settings,
    warehouse: Warehouse,
    path: Path,
    query: ExportQuery,
    selection: Iterable[PartitionRows],
    build: BuildExamples,
    options: TrainingOptions | None = None,
    card: CardOptions | None = None,
) -> Path:
    """The folder at `path`, whole or not at all; its rows shaped by `options` (`--system
    once`: the digests in `system.json`); `card`: what the card declares; its figures are read
    from `warehouse` (the snapshots the rows were read from)."""
    options = options or TrainingOptions()
    _refuse_foreign(path)
    tally = _Tally()
    with private_folder_swap(path) as folder:
        data = folder / DATA
        data.mkdir(mode=0o700)
        parts = 0
        for rows in selection:
            built = build(rows)
            tally.add(rows, built)
            if built:
                _write_part(data, parts, built, options)
                parts += 1
        if not tally.examples:
            raise MissingInputError(f"no rows to export in {query.describe()}")
        if options.system_turn == "once":
            _write_systems(folder / SYSTEM_FILE, tally.systems)
        # The card also says how the rows are shaped (what --reasoning drop left out).
        declared = card or CardOptions()
        declared = declared.model_copy(update={"notes": (*declared.notes, *options.card_notes)})
        build_card(_card(settings, warehouse, query, tally), declared).save(folder / CARD)
        (folder / CARD).chmod(PRIVATE_FILE_MODE)
    return path


def push_to_hub(folder: Path, repo: str) -> str:
    """`--push-to-hub REPO`: the folder uploaded as it is to the Hub dataset repository `repo`
    (created private when missing), with the Hub's own client and its token (`HF_TOKEN` or
    `hf auth login`); returns the commit's URL. The files an earlier export left there that this
    one does not write (its data files, its system prompts) go in the same commit: the card's
    `data/*` would load them with the new ones. Other files of the repository stay."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    api = HfApi()
    try:
        api.create_repo(repo, repo_type="dataset", private=True, exist_ok=True)
        commit = api.upload_folder(
            repo_id=repo,
            folder_path=folder,
            repo_type="dataset",
            commit_message="kimi-batch export",
            delete_patterns=[f"{DATA}/*", SYSTEM_FILE],
        )
    except (HfHubHTTPError, OSError, ValueError) as error:
        raise ConfigError(f"could not push {folder} to the Hub dataset {repo}: {error}") from error
    return commit.commit_url
