"""The dataset card of an `hf` export, built with `huggingface_hub`'s `DatasetCard` and
`DatasetCardData`: the metadata the Hub reads (license, language, pretty_name, task categories,
size, the `train` split of `data/*.parquet` that `datasets.load_dataset(folder)` reads) plus a
`kimi_batch` block of how the rows were made, then the same figures for a person.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

import yaml
from huggingface_hub import CardData, DatasetCard, DatasetCardData
from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.errors import ConfigError
from kimi_batch.exports.language import is_language_code

# The quality gate's reasons name the kept row or benchmark item after their kind.
_GATE = re.compile(r"^(duplicate|near_duplicate) of |^(contaminated):")
_DETAIL = re.compile(r":| \(")
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
_NUMBER = re.compile(r"\d+(\.\d+)?")


def reason_name(reason: str) -> str:
    """A quarantine reason without what is particular to its row: the gate's kind
    (`duplicate`, `near_duplicate`, `contaminated`), else the reason up to its details (a ':'
    or a parenthesis), quoted values as `…` and numbers as `N` ("answer cut off at
    max_tokens", "prompt is N tokens, over the limit of N")."""
    text = reason.strip()
    gate = _GATE.match(text)
    if gate:
        return gate.group(1) or gate.group(2)
    name = _DETAIL.split(text, maxsplit=1)[0].strip()
    name = _NUMBER.sub("N", _QUOTED.sub("…", name))
    return name or "other"


class CardOptions(BaseModel):
    """What the user declares on the card (`kimi-batch export --license/--language/
    --pretty-name`); `notes` are lines other export options add (what they left out)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    license: str = Field(
        default="other",
        description="The card's license id; `other` by default: the teacher's license governs.",
    )
    language: tuple[str, ...] = Field(
        default=(), description="Language codes; none: guessed from the rows by script."
    )
    pretty_name: str | None = Field(default=None, description="None: named after the model.")
    notes: tuple[str, ...] = ()

    def check(self) -> CardOptions:
        """These options with their ids in the Hub's spelling (lower case): ConfigError, one
        line naming the option, for a license id the Hub does not list (`HUB_LICENSES`) or a
        language code the Hub cannot know (`language.is_language_code`). `run_export` checks
        them before it reads anything: the Hub would refuse the card only at the upload."""
        license_id = self.license.lower()
        if license_id not in HUB_LICENSES:
            raise ConfigError(
                f"--license {self.license!r} is not a license id the Hugging Face Hub knows "
                "(such as apache-2.0, mit, cc-by-4.0; the list: "
                "https://huggingface.co/docs/hub/repositories-licenses), or other"
            )
        languages = tuple(code.lower() for code in self.language)
        for given, code in zip(self.language, languages, strict=True):
            if not is_language_code(code):
                raise ConfigError(
                    f"--language {given!r} is not a language code the Hub knows: ISO 639-1 (two "
                    "letters, such as en, fr, zh), ISO 639-2/3 (three, such as yue, fil), or code"
                )
        return self.model_copy(update={"license": license_id, "language": languages})


# The license ids the Hub lists (https://huggingface.co/docs/hub/repositories-licenses, as of
# 2026-08); it refuses a card whose `license` is none of them. `huggingface_hub` checks a card
# only online (`RepoCard.validate` posts it to the Hub), so the list is written here.
_HUB_LICENSE_IDS = (
    "apache-2.0 mit openrail bigscience-openrail-m creativeml-openrail-m "
    "bigscience-bloom-rail-1.0 bigcode-openrail-m afl-3.0 artistic-2.0 bsl-1.0 bsd bsd-2-clause "
    "bsd-3-clause bsd-3-clause-clear c-uda cc cc0-1.0 cc-by-2.0 cc-by-2.5 cc-by-3.0 cc-by-4.0 "
    "cc-by-sa-3.0 cc-by-sa-4.0 cc-by-nc-2.0 cc-by-nc-3.0 cc-by-nc-4.0 cc-by-nd-4.0 "
    "cc-by-nc-nd-3.0 cc-by-nc-nd-4.0 cc-by-nc-sa-2.0 cc-by-nc-sa-3.0 cc-by-nc-sa-4.0 "
    "cdla-sharing-1.0 cdla-permissive-1.0 cdla-permissive-2.0 wtfpl ecl-2.0 epl-1.0 epl-2.0 "
    "etalab-2.0 eupl-1.1 eupl-1.2 agpl-3.0 gfdl gpl gpl-2.0 gpl-3.0 lgpl lgpl-2.1 lgpl-3.0 isc "
    "h-research intel-research lppl-1.3c ms-pl apple-ascl apple-amlr mpl-2.0 odc-by odbl "
    "openmdw-1.0 openmdw-1.1 openrail++ osl-3.0 postgresql ofl-1.1 ncsa unlicense zlib pddl "
    "lgpl-lr deepfloyd-if-license fair-noncommercial-research-license llama2 llama3 llama3.1 "
    "llama3.2 llama3.3 llama4 grok2-community gemma unknown other"
)
HUB_LICENSES = frozenset(_HUB_LICENSE_IDS.split())


LICENSE_NOTE = (
    "License `other`: the answers are a model's outputs, and the teacher model's license (and "
    "its terms on training other models with its outputs) governs their use. Export with "
    "--license to declare another."
)


class _Figures(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TokenStats(_Figures):
    count: int = Field(ge=0)
    mean: float
    p50: int
    p95: int
    max: int

    @classmethod
    def of(cls, values: Sequence[int]) -> TokenStats:
        """Nearest-rank percentiles (a value that occurs), so they read as token counts."""
        ordered = sorted(values)
        if not ordered:
            return cls(count=0, mean=0.0, p50=0, p95=0, max=0)

        def rank(p: float) -> int:
            return ordered[max(0, math.ceil(p * len(ordered)) - 1)]

        return cls(
            count=len(ordered),
            mean=round(sum(ordered) / len(ordered), 2),
            p50=rank(0.5),
            p95=rank(0.95),
            max=ordered[-1],
        )


class InputSource(_Figures):
    """One partition's landed input: the sha256 of the versions its rows were built from."""

    ds: str
    source: str
    file: str | None = Field(description="The inbox file's name, when the manifest knows it.")
    input_sha256: list[str]
    latest_sha256: str | None = Field(description="The newest landed version (the manifest).")
    rows: int = Field(ge=0)

    @property
    def landed(self) -> str:
        if self.latest_sha256 is None:
            return "not in the landing manifest"
        return (
            "current" if self.input_sha256 == [self.latest_sha256] else "stale: newer input landed"
        )


class SamplingFigures(_Figures):
    recorded: bool = Field(description="False: the rows do not record their sampling.")
    params: dict[str, float | int | None]
    top_k_logprobs: int = Field(ge=0, description="Top-k of the rows' logprobs (0: none).")
    rows_with_overrides: int = Field(ge=0, description="Seeds that set their own sampling.")
    note: str


class DedupFigures(_Figures):
    dedup: bool
    dedup_fields: str
    dedup_threshold: float
    dedup_shingle: int
    benchmarks: list[str]
    contamination_ngram: int


class CardFigures(_Figures):
    """What the card says about the rows, gathered by the export."""

    rows: int = Field(ge=0)
    snapshots: dict[str, int] = Field(
        default_factory=dict, description="The Iceberg snapshot of each table the rows came from."
    )
    models: list[str]
    digest_sha256: list[str]
    sources: list[InputSource]
    sampling: SamplingFigures
    quarantine: dict[str, int] = Field(description="Quarantined rows by reason (`reason_name`).")
    quality: DedupFigures
    prompt_tokens: TokenStats
    completion_tokens: TokenStats
    min_judge_score: int | None
    judged_rows: int = Field(ge=0)
    judge_scores: dict[int, int] = Field(default_factory=dict, description="Rows by score.")
    dropped_unjudged: int = Field(ge=0)
    dropped_below_score: int = Field(ge=0)
    languages: list[str] = Field(description="Guessed from the rows' scripts (`language`).")
    languages_note: str = ""


# The Hub's size categories, a decade each (huggingface_hub's `DatasetCardData`, datasets'
# `size_categories.json`): a value outside them is not one the Hub filters on.
_SIZE_CATEGORIES = (
    (10**3, "n<1K"),
    (10**4, "1K<n<10K"),
    (10**5, "10K<n<100K"),
    (10**6, "100K<n<1M"),
    (10**7, "1M<n<10M"),
    (10**8, "10M<n<100M"),
    (10**9, "100M<n<1B"),
    (10**10, "1B<n<10B"),
    (10**11, "10B<n<100B"),
    (10**12, "100B<n<1T"),
)


def _size_category(rows: int) -> str:
    return next((name for bound, name in _SIZE_CATEGORIES if rows < bound), "n>1T")


def _made(card: CardFigures) -> dict[str, Any]:
    """The card's `kimi_batch` metadata block: how the rows were made, for a program."""
    return {
        "models": card.models,
        "digest_sha256": card.digest_sha256,
        "sources": [
            {"ds": s.ds, "source": s.source, "file": s.file, "input_sha256": s.input_sha256}
            for s in card.sources
        ],
        # The Iceberg snapshot of each table the rows were read from (`export --as-of` reads
        # that state back); the landed inputs' sha256 above name what the rows were built from.
        "table_snapshot_ids": dict(sorted(card.snapshots.items())) or None,
        "sampling": card.sampling.params,
        "top_k_logprobs": card.sampling.top_k_logprobs,
        "quarantine": card.quarantine,
    }


def build_card(card: CardFigures, options: CardOptions) -> DatasetCard:
    """The card: `huggingface_hub`'s metadata, then the body."""
    models = ", ".join(card.models) or "a teacher model"
    data = DatasetCardData(
        license=options.license,
        language=list(options.language) or card.languages or None,
        pretty_name=options.pretty_name or f"Distilled answers of {models}",
        task_categories=["text-generation"],
        size_categories=[_size_category(card.rows)],
        tags=["distillation", "synthetic"],
        configs=[
            {"config_name": "default", "data_files": [{"split": "train", "path": "data/*.parquet"}]}
        ],
        kimi_batch=_made(card),
    )
    notes = [*(LICENSE_NOTE,) * (options.license == "other"), *options.notes]
    if not options.language and card.languages_note:
        notes.append(f"Language: {card.languages_note}")
    body = "\n".join([*_body(card, data.pretty_name or models), *_notes(notes), ""])
    return _Card(f"---\n{_metadata_yaml(data)}\n---\n{body}")


class _MetadataDumper(yaml.SafeDumper):
    """YAML as `DatasetCardData.to_yaml` writes it, but a string holding U+0085 (NEL), U+2028
    or U+2029 is double-quoted, where they are escaped (`\\N`, `\\L`, `\\P`). PyYAML writes
    them raw inside a single-quoted string as line breaks (YAML 1.1's), the next line indented:
    it reads NEL back as a space (a file or model name with one was another name in the card's
    metadata), and a YAML 1.2 reader, as the Hub's, reads U+2028 and U+2029 as plain characters
    with that indent after them."""


# The line breaks of YAML 1.1 that YAML 1.2 does not have.
_YAML_11_BREAKS = ("\x85", "\u2028", "\u2029")


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = '"' if any(char in value for char in _YAML_11_BREAKS) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_MetadataDumper.add_representer(str, _represent_str)


def _metadata_yaml(data: CardData) -> str:
    return yaml.dump(
        data.to_dict(), Dumper=_MetadataDumper, sort_keys=False, allow_unicode=True
    ).strip()


class _Card(DatasetCard):
    """The card, its text (`str`, `save`) written with `_metadata_yaml`: `RepoCard` writes
    its metadata again with `to_yaml` whenever it is written out."""

    @property
    def content(self) -> str:
        return f"---\n{_metadata_yaml(self.data)}\n---\n{self.text}"

    @content.setter
    def content(self, content: str) -> None:
        DatasetCard.content.__set__(self, content)


def _notes(notes: Sequence[str]) -> list[str]:
    return ["", "## Notes", "", *(f"- {note}" for note in notes)] if notes else []


def _table(head: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    return [*lines, *("| " + " | ".join(_cell(cell) for cell in row) + " |" for row in rows)]


_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def _cell(value: object) -> str:
    """A table cell's text on one line, its `|` escaped (and `\\`, which would escape the
    escape): an inbox file, a benchmark or a reason holding either split its row into more
    cells, and a line break cut the row in two."""
    text = str(value).replace("\\", "\\\\").replace("|", "\\|")
    return _LINE_BREAK.sub(" ", text)


def _heading(title: str) -> str:
    """A `#` heading of `title` on one line (a line break cut it: its next line was a paragraph,
    or with "===" under it a heading of its own), its last `#` escaped, which Markdown would read
    as the heading's closing sequence and drop."""
    text = _LINE_BREAK.sub(" ", title).strip()
    return f"# {text[:-1]}\\#" if text.endswith("#") else f"# {text}"


_BACKTICKS = re.compile(r"`+")


def _code(value: str) -> str:
    """`value` as a Markdown code span on one line, read back as `value` (its line breaks as
    spaces, as a code span reads them): fenced with one backtick more than its longest run of
    them (a backtick in a model name ended its span early), and padded with a space where it
    starts or ends with a backtick or with a space at both ends (Markdown strips one there). An
    empty value, which no span holds, is a space."""
    text = _LINE_BREAK.sub(" ", value) or " "
    fence = "`" * (max(map(len, _BACKTICKS.findall(text)), default=0) + 1)
    if text[0] == "`" or text[-1] == "`" or (text[0] == text[-1] == " " and text.strip(" ")):
        text = f" {text} "
    return f"{fence}{text}{fence}"


def _body(card: CardFigures, title: str) -> list[str]:
    return [
        "",
        _heading(title),
        "",
        f"{card.rows} teacher answers from kimi-batch's `distilled` table, one conversation each "
        "(system digest, user side, answer; the notes below say how the rows lay it out).",
        "",
        f"- Model: {', '.join(_code(m) for m in card.models) or 'none'}",
        f"- System digest sha256: {', '.join(f'`{d}`' for d in card.digest_sha256) or 'none'}",
        *_judge_lines(card),
        "",
        "## Snapshots",
        "",
        "The Iceberg snapshot of each warehouse table the rows were read from: each table "
        "reads as it was then, whatever later nights replaced.",
        "",
        *_table(("table", "snapshot id"), sorted(card.snapshots.items()) or [("none", "")]),
        "",
        "## Sources",
        "",
        *_table(
            ("ds", "source", "file", "input sha256", "rows", "latest landed"),
            _source_rows(card.sources),
        ),
        "",
        "The input sha256 above name the landed input versions the rows were built from.",
        "",
        "## Sampling",
        "",
        card.sampling.note,
        "",
        *_table(("parameter", "value"), sorted(card.sampling.params.items())),
        "",
        f"Top-k logprobs per token: {card.sampling.top_k_logprobs}. Seeds with their own "
        f"sampling overrides: {card.sampling.rows_with_overrides}.",
        "",
        "## Quarantine (rows kept out, by reason)",
        "",
        *_table(("reason", "rows"), sorted(card.quarantine.items()) or [("none", 0)]),
        "",
        "## Duplicates and decontamination",
        "",
        *_table(("setting", "value"), _quality_rows(card.quality)),
        "",
        "## Tokens",
        "",
        *_table(("tokens", "count", "mean", "p50", "p95", "max"), _token_rows(card)),
    ]


def _source_rows(sources: Sequence[InputSource]) -> list[tuple[object, ...]]:
    return [
        (
            s.ds,
            s.source,
            s.file or "",
            ", ".join(f"`{sha}`" for sha in s.input_sha256),
            s.rows,
            s.landed,
        )
        for s in sources
    ]


def _token_rows(card: CardFigures) -> list[tuple[object, ...]]:
    pairs = (("prompt", card.prompt_tokens), ("completion", card.completion_tokens))
    return [(name, s.count, s.mean, s.p50, s.p95, s.max) for name, s in pairs]


def _judge_lines(card: CardFigures) -> list[str]:
    lines = [f"- Judged rows: {card.judged_rows}"]
    if card.judge_scores:
        spread = ", ".join(f"{score}: {n}" for score, n in sorted(card.judge_scores.items()))
        lines.append(f"- Judge scores (score: rows): {spread}")
    if card.min_judge_score is not None:
        lines.append(
            f"- Judge score floor: {card.min_judge_score} ({card.dropped_below_score} rows below "
            f"it and {card.dropped_unjudged} unjudged rows left out)"
        )
    return lines


def _quality_rows(quality: DedupFigures) -> list[tuple[str, object]]:
    return [
        ("duplicate removal", "on" if quality.dedup else "off"),
        ("near-duplicates judged on", quality.dedup_fields),
        ("near-duplicate threshold (MinHash Jaccard)", quality.dedup_threshold),
        ("shingle (words)", quality.dedup_shingle),
        ("benchmarks", ", ".join(quality.benchmarks) or "none"),
        ("contamination n-gram (words)", quality.contamination_ngram),
    ]


def quarantine_counts(reasons: Sequence[str]) -> dict[str, int]:
    return dict(Counter(reason_name(reason) for reason in reasons))
