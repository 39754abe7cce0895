"""Properties of what a trainer reads (`kimi_batch.exports`): whatever an answer holds, its row
carries it exactly, in every shape and in the `hf` folder as `datasets` reads it back; a `kd`
line is strict JSON of the answer's tokens; the dataset card's metadata reads back as the Hub
reads it, and no name or file in it breaks the card's tables; the quarantine's reason names
and the guessed languages are sane on any text.

- conversation: an answer's example is its digest (none when empty or `--no-system`), its seed's
  turns (a variant's prompt with the seed's instructions folded in), then the answer, byte for
  byte, with its reasoning, tool calls and the request's tools.
- shape: in every `--reasoning`/`--layout`/`--system` combination the row (and its chat line)
  is that conversation with the assistant message the options describe; tool calls in OpenAI's
  shape with the arguments as the model wrote them.
- hf: `write_hf` of any partitions writes the columns `hf_schema` names, and `datasets` reads
  back every row as the trainer row it was (a key a message lacks reads as null: one Parquet
  struct holds every message), with `--system once`'s digests in `system.json`.
- kd: for any finite logprobs (the ledger refuses others), one line of strict JSON (no NaN or
  Infinity) reading back as the tokens, their ids and top-k, in order.
- card: the metadata `build_card` writes reads back through `huggingface_hub.DatasetCard` as the
  figures and options it was given (no YAML 1.1 line break written raw, which a YAML 1.2 reader
  reads otherwise), and, read by a CommonMark parser, the body opens with a one-line heading of
  the title, the intro and the "Model" bullet whose code spans are the model names, and every
  table row has its header's cells, for any model name, file name, reason, pretty name (YAML and
  Markdown syntax, backticks, line breaks).
- `reason_name`, `quarantine_counts`, `is_language_code`, `ScriptCounter`, `TokenStats.of` on
  any text or numbers.

Everything is built through the project's own models (`DistilledRow`, `SeedRow`, `SystemDigest`,
`PartitionRows`, `CardFigures`). The `hf` property writes into one embedded warehouse's home
(SQLite catalog, no server), each example to its own folder.
"""

from __future__ import annotations

import json
import math
import re
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import datasets
import polars as pl
import pytest
from huggingface_hub import DatasetCard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from kimi_batch.engine import SystemDigest, fold_instructions
from kimi_batch.exports import (
    CardFigures,
    CardOptions,
    DedupFigures,
    ExportQuery,
    InputSource,
    PartitionRows,
    SamplingFigures,
    ScriptCounter,
    SystemTexts,
    TokenStats,
    TrainingOptions,
    build_card,
    kd_line,
    quarantine_counts,
    reason_name,
    write_hf,
)
from kimi_batch.exports.card import HUB_LICENSES
from kimi_batch.exports.conversation import ExportExample, examples
from kimi_batch.exports.hf import hf_schema
from kimi_batch.exports.language import ISO_639_1, is_language_code
from kimi_batch.llama import TokenLogprob, TopLogprob
from kimi_batch.pipeline import DistilledRow, SeedMessage, SeedRow, Verdict
from kimi_batch.settings import Settings
from kimi_batch.warehouse import Warehouse, open_warehouse
from kimi_batch_tests.support.rows import CREATED_AT

EXAMPLES = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FEW = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Scripts, combining marks, emoji, NUL and other controls, every line break Unicode and YAML
# know, and the syntax of JSON, YAML and Markdown tables (no lone surrogate: the input readers
# and the ledger refuse them, so no row holds one).
_ODD = (
    "日本語の質問中文Русскийعربيעבריתहिन्दी😀👩‍👩‍👧é\u0301\x00\x01\x1b\x7f\x85\u2028\u2029"
    "\u200b\ufeff\t\r\n \"'\\{}[]|#:-`*&!%@>"
)
TEXT = st.text(st.one_of(st.characters(codec="utf-8"), st.sampled_from(_ODD)), max_size=20)
SHA = st.text("0123456789abcdef", min_size=64, max_size=64)
OPTIONS = st.builds(
    TrainingOptions,
    reasoning=st.sampled_from(["field", "inline", "drop"]),
    layout=st.sampled_from(["messages", "prompt-completion"]),
    system_turn=st.sampled_from(["keep", "drop", "once"]),
    think_tags=st.sampled_from([("<think>", "</think>"), ("◁think▷", "◁/think▷")]),
)

# ---- answers ------------------------------------------------------------------------------------

_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(1 << 70), 1 << 70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8,
)
# The model's arguments as it wrote them: JSON text mostly, any text sometimes.
_ARGUMENTS = st.one_of(_JSON.map(lambda v: json.dumps(v, ensure_ascii=False)), TEXT)
_CALL = st.fixed_dictionaries(
    {
        "id": TEXT,
        "type": st.just("function"),
        "function": st.fixed_dictionaries({"name": TEXT, "arguments": _ARGUMENTS}),
    }
)
_TOOL = st.fixed_dictionaries(
    {
        "type": st.just("function"),
        "function": st.fixed_dictionaries(
            {"name": st.from_regex(r"[A-Za-z0-9_-]{1,64}", fullmatch=True)},
            optional={"description": TEXT, "parameters": st.dictionaries(TEXT, _JSON, max_size=3)},
        ),
    }
)
ORIGINS: tuple[Literal["seed", "variant"], ...] = ("seed", "variant")
_TURN = st.builds(SeedMessage, role=st.sampled_from(["user", "assistant"]), content=TEXT)


@st.composite
def _seed(draw: st.DrawFn, input_id: str) -> SeedRow:
    earlier = draw(st.lists(_TURN, max_size=3))
    instructions = draw(st.none() | TEXT)
    prompt = draw(TEXT)
    last = SeedMessage(role="user", content=fold_instructions(instructions, prompt))
    return SeedRow(
        input_id=input_id,
        messages=[*earlier, last],
        prompt=prompt,
        instructions=instructions,
        source_file="in.jsonl",
        line=1,
        input_sha256="a" * 64,
        created_at=CREATED_AT,
    )


@st.composite
def _answer(draw: st.DrawFn, index: int, seed: SeedRow, digest: str) -> DistilledRow:
    origin = draw(st.sampled_from(ORIGINS))
    calls = draw(st.none() | st.lists(_CALL, min_size=1, max_size=2))
    tools = draw(st.none() | st.lists(_TOOL, min_size=1, max_size=2))
    return DistilledRow(
        request_id=f"answer-{index}",
        input_id=seed.input_id if origin == "seed" else f"variant-{index}",
        model=draw(TEXT),
        digest_sha256=digest,
        prompt_tokens=draw(st.integers(0, 1 << 40)),
        cached_tokens=0,
        completion_tokens=draw(st.integers(0, 1 << 40)),
        finish_reason="stop",
        prompt_ms=1.0,
        predicted_ms=1.0,
        latency_ms=1.0,
        endpoint="http://127.0.0.1:8081",
        created_at=CREATED_AT,
        input_sha256=seed.input_sha256,
        seed_id=seed.input_id,
        origin=origin,
        strategy=None if origin == "seed" else draw(TEXT),
        prompt=seed.prompt if origin == "seed" else draw(TEXT),
        response=draw(TEXT),
        reasoning=draw(st.none() | TEXT),
        structured=None,
        logprobs=None,
        tool_calls=json.dumps(calls, ensure_ascii=False) if calls else None,
        tools=json.dumps(tools, ensure_ascii=False) if tools else None,
    )


@st.composite
def _partition(draw: st.DrawFn, ds: str, source: str, digests: list[SystemDigest]) -> PartitionRows:
    seeds = [draw(_seed(f"seed-{i}")) for i in range(draw(st.integers(1, 2)))]
    answers = [
        draw(_answer(i, draw(st.sampled_from(seeds)), draw(st.sampled_from(digests)).sha256))
        for i in range(draw(st.integers(1, 3)))
    ]
    verdict = st.builds(Verdict, score=st.integers(1, 10), reason=st.just("fine"))
    judged = draw(
        st.none() | st.dictionaries(st.sampled_from([a.request_id for a in answers]), verdict)
    )
    return PartitionRows(
        ds=ds,
        source=source,
        answers=answers,
        seeds={seed.input_id: seed for seed in seeds},
        judgements=judged,
    )


# A digest may be empty (no system turn is sent then).
DIGESTS = st.lists(TEXT, min_size=1, max_size=2, unique=True).map(
    lambda texts: [SystemDigest.from_text(text) for text in texts]
)


def _conversation(answer: DistilledRow, seed: SeedRow, system: str) -> list[dict[str, str]]:
    """What the teacher was asked and answered, written out from the rows: the contract."""
    turns = [{"role": "system", "content": system}] if system else []
    if answer.origin == "seed":
        turns += [{"role": m.role, "content": m.content} for m in seed.messages]
    else:
        turns.append(
            {"role": "user", "content": fold_instructions(seed.instructions, answer.prompt)}
        )
    return [*turns, {"role": "assistant", "content": answer.response}]


def _assistant(answer: DistilledRow, options: TrainingOptions) -> dict[str, Any]:
    """The answer's message as the options describe it (exports/shape.py's docstring)."""
    message: dict[str, Any] = {"role": "assistant", "content": answer.response}
    if answer.reasoning and options.reasoning == "field":
        message["reasoning_content"] = answer.reasoning
    if answer.reasoning and options.reasoning == "inline":
        opening, closing = options.think_tags
        inline = f"{opening}\n{answer.reasoning.strip()}\n{closing}\n\n{answer.response}"
        message["content"] = inline
    if answer.tool_calls:
        message["tool_calls"] = json.loads(answer.tool_calls)
    return message


def _row(
    answer: DistilledRow, seed: SeedRow, system: str, options: TrainingOptions
) -> dict[str, Any]:
    """The trainer's row of the answer, written out from the rows and the options."""
    *asked, _ = _conversation(answer, seed, system)
    if options.system_turn != "keep":
        asked = [turn for turn in asked if turn["role"] != "system"]
    message = _assistant(answer, options)
    row: dict[str, Any] = (
        {"messages": [*asked, message]}
        if options.layout == "messages"
        else {"prompt": asked, "completion": [message]}
    )
    if answer.tools:
        row["tools"] = json.loads(answer.tools)
    if options.system_turn == "once":
        row["system_sha256"] = answer.digest_sha256
    return row


@EXAMPLES
@given(data=st.data(), digests=DIGESTS, omit=st.booleans(), options=OPTIONS)
def test_every_shape_of_an_answer_s_row_is_what_was_asked_and_answered_byte_for_byte(
    data: st.DataObject, digests: list[SystemDigest], omit: bool, options: TrainingOptions
) -> None:
    rows = data.draw(_partition("2026-11-30", "alpha", digests))
    built = examples(rows, SystemTexts(digests, omit=omit))
    assert [example.request_id for example in built] == [a.request_id for a in rows.answers]
    texts = {digest.sha256: digest.text for digest in digests}
    for answer, example in zip(rows.answers, built, strict=True):
        seed = rows.seeds[answer.seed_id]
        system = "" if omit else texts[answer.digest_sha256]
        conversation = _conversation(answer, seed, system)
        assert [turn.model_dump() for turn in example.messages] == conversation
        assert example.system_text == system
        assert (example.reasoning, example.tool_calls, example.tools) == (
            answer.reasoning,
            answer.tool_calls,
            answer.tools,
        )
        assert example.judge_score == rows.score(answer)
        expected = _row(answer, seed, system, options)
        assert example.trainer_row(options) == expected
        # The chat line is that row as one line of JSON, its text as written: escapes only
        # where JSON needs them (controls, quotes), none for other characters.
        line = example.chat_line(options)
        assert "\n" not in line
        assert json.loads(line) == expected
        assert line.count("\\u") == json.dumps(expected, ensure_ascii=False).count("\\u")


# ---- the hf folder ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Settings, Warehouse]]:
    """One deployment's home for every example: its warehouse holds no partition, so the card's
    figures come from the rows written (as a real export's of partitions since rebuilt)."""
    root = tmp_path_factory.mktemp("hf")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KIMI_BATCH_HOME", str(root / "home"))
        patch.setenv("HF_HUB_OFFLINE", "1")
        settings = Settings.from_env()
        yield settings, open_warehouse(settings)


_MESSAGE_KEYS = ("role", "content", "reasoning_content", "tool_calls")


def _as_parquet(message: dict[str, Any]) -> dict[str, Any]:
    """A message as one Parquet struct holds it: every key, null where the message has none."""
    return {key: message.get(key) for key in _MESSAGE_KEYS}


def _hf_row(
    example: ExportExample, row: dict[str, Any], options: TrainingOptions
) -> dict[str, Any]:
    conversation = {
        key: [_as_parquet(message) for message in row[key]]
        for key in (("messages",) if options.layout == "messages" else ("prompt", "completion"))
    }
    once = {"system_sha256": row["system_sha256"]} if options.system_turn == "once" else {}
    columns = example.model_dump(exclude={"messages"})
    return {**conversation, "tools": row.get("tools"), **once, **columns}


@FEW
@given(data=st.data(), digests=DIGESTS, options=OPTIONS, parts=st.integers(1, 2))
def test_datasets_reads_the_hf_folder_back_as_the_trainer_rows_in_the_schema(
    home: tuple[Settings, Warehouse],
    data: st.DataObject,
    digests: list[SystemDigest],
    options: TrainingOptions,
    parts: int,
) -> None:
    settings, warehouse = home
    selection = [data.draw(_partition(f"2026-11-{29 + i}", "alpha", digests)) for i in range(parts)]
    system = SystemTexts(digests)
    built = [example for rows in selection for example in examples(rows, system)]
    with tempfile.TemporaryDirectory(dir=settings.home.parent) as scratch:
        folder = Path(scratch) / "out.hf"
        write_hf(
            settings,
            warehouse,
            folder,
            ExportQuery(),
            selection,
            lambda rows: examples(rows, system),
            options,
        )
        files = sorted(str(path) for path in (folder / "data").glob("*.parquet"))
        assert len(files) == parts
        # The schema is the one hf_schema names, in every file.
        for file in files:
            assert pl.read_parquet_schema(file) == hf_schema(options)
        # As the module promises a trainer loads it.
        loaded = datasets.load_dataset(
            "parquet", data_dir=str(folder), split="train", cache_dir=str(Path(scratch) / "c")
        )
        assert isinstance(loaded, datasets.Dataset)
        assert loaded.column_names == list(hf_schema(options))
        read = loaded.to_list()
        card = DatasetCard.load(folder / "README.md").data.to_dict()
        systems = (folder / "system.json").read_text() if options.system_turn == "once" else None
    assert len(read) == len(built)
    for example, got in zip(built, read, strict=True):
        row = example.trainer_row(options)
        # The request's tools are one JSON text column: the same JSON, text as written.
        tools = got.pop("tools")
        assert (json.loads(tools) if tools is not None else None) == row.get("tools")
        if tools is not None:
            assert tools == json.dumps(json.loads(tools), ensure_ascii=False)
        expected = _hf_row(example, row, options)
        expected.pop("tools")
        assert got == expected
    assert card["kimi_batch"]["models"] == sorted({example.model for example in built})
    if systems is not None:
        by_sha = {digest.sha256: digest.text for digest in digests}
        assert json.loads(systems) == {e.digest_sha256: by_sha[e.digest_sha256] for e in built}


# ---- kd lines -----------------------------------------------------------------------------------

# Any finite logprob (the ledger refuses NaN and infinities), the extremes and -0.0 too.
LOGPROBS = st.floats(allow_nan=False, allow_infinity=False, max_value=0.0) | st.sampled_from(
    [-0.0, -1e308, -5e-324, -math.ulp(0.0)]
)
TOKEN_IDS = st.none() | st.integers(0, (1 << 63) - 1)
TOKENS = st.builds(
    TokenLogprob,
    token=TEXT,
    logprob=LOGPROBS,
    top=st.lists(st.builds(TopLogprob, token=TEXT, logprob=LOGPROBS, id=TOKEN_IDS), max_size=4),
    id=TOKEN_IDS,
)


def _strict(constant: str) -> object:
    raise AssertionError(f"a kd line holds {constant}, which strict JSON readers refuse")


@EXAMPLES
@given(tokens=st.lists(TOKENS, max_size=6), chat=st.dictionaries(TEXT, _JSON, max_size=3))
def test_a_kd_line_is_strict_json_of_the_answer_s_tokens_in_order(
    tokens: list[TokenLogprob], chat: dict[str, Any]
) -> None:
    fields = {"request_id", "model", "top_k", "completion", "tokenizer", "logprobs"}
    chat = {key: value for key, value in chat.items() if key not in fields}
    line = kd_line(chat=chat, request_id="r", model="m", logprobs=tokens, tokenizer=None)
    assert "\n" not in line
    record = json.loads(line, parse_constant=_strict)
    assert {key: record[key] for key in chat} == chat
    assert record["top_k"] == max((len(token.top) for token in tokens), default=0)
    assert record["completion"] == "".join(token.token for token in tokens)
    positions = record["logprobs"]["content"]
    assert len(positions) == len(tokens)
    for position, token in zip(positions, tokens, strict=True):
        assert (position["id"], position["token"]) == (token.id, token.token)
        # The same double, its sign too.
        assert math.copysign(1, position["logprob"]) == math.copysign(1, token.logprob)
        assert position["logprob"] == token.logprob
        assert position["top_logprobs"] == [
            {"id": top.id, "token": top.token, "logprob": top.logprob} for top in token.top
        ]


# ---- the dataset card ---------------------------------------------------------------------------

# What a name may be: any text, a file's name any but '/' and NUL (an inbox file's).
FILE_NAMES = TEXT.map(lambda name: name.replace("/", "_").replace("\x00", "_")).filter(bool)
SOURCES = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,20}", fullmatch=True)
DAYS = st.dates().map(lambda day: day.isoformat())
LANGUAGES = st.sampled_from([*sorted(ISO_639_1), "yue", "fil", "code"])
SAMPLING = st.fixed_dictionaries(
    {
        "max_tokens": st.integers(1, 1 << 40),
        "temperature": st.floats(0, 2),
        "top_p": st.floats(0, 1),
        "seed": st.none() | st.integers(0, (1 << 63) - 1),
    }
)
_INPUT = st.builds(
    InputSource,
    ds=DAYS,
    source=SOURCES,
    file=st.none() | FILE_NAMES,
    input_sha256=st.lists(SHA, min_size=1, max_size=2),
    latest_sha256=st.none() | SHA,
    rows=st.integers(0, 1 << 40),
)
FIGURES = st.builds(
    CardFigures,
    rows=st.integers(0, 10**13),
    snapshots=st.dictionaries(
        st.sampled_from(["distilled", "seeds", "quarantine"]), st.integers(1, (1 << 63) - 1)
    ),
    models=st.lists(TEXT, max_size=3),
    digest_sha256=st.lists(SHA, max_size=2),
    sources=st.lists(_INPUT, max_size=3),
    sampling=st.builds(
        SamplingFigures,
        recorded=st.booleans(),
        params=SAMPLING,
        top_k_logprobs=st.integers(0, 100),
        rows_with_overrides=st.integers(0, 1000),
        note=TEXT,
    ),
    quarantine=st.dictionaries(TEXT.map(reason_name), st.integers(1, 1 << 40), max_size=4),
    quality=st.builds(
        DedupFigures,
        dedup=st.booleans(),
        dedup_fields=TEXT,
        dedup_threshold=st.floats(0, 1),
        dedup_shingle=st.integers(1, 20),
        benchmarks=st.lists(FILE_NAMES, max_size=2),
        contamination_ngram=st.integers(1, 50),
    ),
    prompt_tokens=st.lists(st.integers(0, 1 << 40), max_size=5).map(TokenStats.of),
    completion_tokens=st.lists(st.integers(0, 1 << 40), max_size=5).map(TokenStats.of),
    min_judge_score=st.none() | st.integers(1, 10),
    judged_rows=st.integers(0, 1000),
    judge_scores=st.dictionaries(st.integers(1, 10), st.integers(1, 1000)),
    dropped_unjudged=st.integers(0, 1000),
    dropped_below_score=st.integers(0, 1000),
    languages=st.lists(LANGUAGES, max_size=3, unique=True),
    languages_note=TEXT,
)
CARD_OPTIONS = st.builds(
    CardOptions,
    license=st.sampled_from(sorted(HUB_LICENSES)),
    language=st.lists(LANGUAGES, max_size=2, unique=True).map(tuple),
    pretty_name=st.none() | TEXT,
    notes=st.lists(TEXT, max_size=2).map(tuple),
)


def _pipes(line: str) -> int:
    """The cell boundaries of a Markdown table row: its pipes not escaped by a backslash."""
    count, escaped = 0, False
    for char in line:
        count += char == "|" and not escaped
        escaped = char == "\\" and not escaped
    return count


def _tables(body: str) -> Iterator[list[str]]:
    """Each Markdown table of the body (Markdown's line endings: LF, CR LF, CR): its lines."""
    lines = re.split(r"\r\n|\r|\n", body)
    for index, line in enumerate(lines):
        if index + 1 < len(lines) and re.fullmatch(r"\|( --- \|)+", lines[index + 1]):
            table = [line]
            for following in lines[index + 1 :]:
                if not following:
                    break
                table.append(following)
            yield table


# Line breaks to YAML 1.1 (PyYAML), not to YAML 1.2: PyYAML indents the line after one in a
# quoted string and drops that indent again on reading; a YAML 1.2 reader keeps it.
_YAML_11_BREAKS = "\x85\u2028\u2029"


def _front_matter(text: str) -> str:
    assert text.startswith("---\n")
    return text[4 : text.index("\n---\n", 3)]


def _markdown(text: str) -> str:
    """`text` as a CommonMark reader holds it: NUL is U+FFFD, a line ending a line feed."""
    return re.sub(r"\r\n|\r", "\n", text.replace("\x00", "\ufffd"))


def _one_line_heading(title: str) -> str:
    """The raw text a CommonMark reader finds in the card's `#` heading of `title`: the title on
    one line, stripped, its last `#` escaped (a closing sequence of the heading otherwise)."""
    text = _markdown(title).replace("\n", " ").strip()
    return text[:-1] + "\\#" if text.endswith("#") else text


def _read_as_code(name: str) -> str:
    """What a CommonMark reader reads in a code span holding `name`: its line breaks as spaces
    (a span cannot be empty: an empty name is a space)."""
    return _markdown(name).replace("\n", " ") or " "


def _heading_and_models(body: str) -> tuple[str, list[str]]:
    """The card body read by a CommonMark parser (markdown-it-py, which rich brings): the raw text
    of its first block, a level-1 heading, and the code spans of its "Model" bullet, which follows
    the paragraph after the heading."""
    tokens = MarkdownIt("commonmark").parse(body)
    blocks = [token for token in tokens if token.level == 0 and token.nesting >= 0]
    assert [(token.type, token.tag) for token in blocks[:3]] == [
        ("heading_open", "h1"),
        ("paragraph_open", "p"),
        ("bullet_list_open", "ul"),
    ]
    inlines = [token for token in tokens if token.type == "inline"]
    heading, intro, model_item = inlines[:3]
    assert intro.content.endswith("the notes below say how the rows lay it out).")
    assert model_item.content.startswith("Model: ")
    assert model_item.map == [(intro.map or [0, 0])[1] + 1, (intro.map or [0, 0])[1] + 2]
    spans = [child.content for child in model_item.children or [] if child.type == "code_inline"]
    return heading.content, spans


@EXAMPLES
@given(figures=FIGURES, options=CARD_OPTIONS)
def test_the_card_s_metadata_reads_back_as_given_and_its_tables_keep_their_columns(
    figures: CardFigures, options: CardOptions
) -> None:
    text = str(build_card(figures, options))
    # Read as the Hub reads a README: its YAML header, parsed again from the text.
    card = DatasetCard(text)
    data = card.data.to_dict()
    named = ", ".join(figures.models) or "a teacher model"
    assert data["license"] == options.license
    assert data.get("language") == (list(options.language) or figures.languages or None)
    assert data["pretty_name"] == (options.pretty_name or f"Distilled answers of {named}")
    assert data["configs"] == [
        {"config_name": "default", "data_files": [{"split": "train", "path": "data/*.parquet"}]}
    ]
    assert len(data["size_categories"]) == 1
    assert data["kimi_batch"] == {
        "models": figures.models,
        "digest_sha256": figures.digest_sha256,
        "sources": [
            {"ds": s.ds, "source": s.source, "file": s.file, "input_sha256": s.input_sha256}
            for s in figures.sources
        ],
        "table_snapshot_ids": figures.snapshots or None,
        "sampling": figures.sampling.params,
        "top_k_logprobs": figures.sampling.top_k_logprobs,
        "quarantine": figures.quarantine,
    }
    # No character a YAML 1.2 reader (the Hub's) reads otherwise than PyYAML is written raw.
    assert not set(_front_matter(text)) & set(_YAML_11_BREAKS)
    heading, models = _heading_and_models(card.text)
    assert heading == _one_line_heading(options.pretty_name or f"Distilled answers of {named}")
    assert models == [_read_as_code(model) for model in figures.models]
    tables = list(_tables(card.text))
    # Snapshots, sources, sampling, quarantine, dedup, tokens: each keeps one row per item.
    assert len(tables) == 6
    for table in tables:
        width = _pipes(table[0])
        for line in table:
            assert line.startswith("|"), table
            assert line.endswith("|"), table
            assert _pipes(line) == width, table
    assert len(tables[1]) == 2 + len(figures.sources)
    assert len(tables[3]) == 2 + max(1, len(figures.quarantine))


def _figures(**update: Any) -> CardFigures:
    """Plain figures of one source, with `update`'s fields."""
    none = TokenStats.of([])
    figures = CardFigures(
        rows=1,
        models=["m"],
        digest_sha256=["0" * 64],
        sources=[
            InputSource(
                ds="2026-11-30",
                source="alpha",
                file="in.jsonl",
                input_sha256=["a" * 64],
                latest_sha256=None,
                rows=1,
            )
        ],
        sampling=SamplingFigures(
            recorded=False, params={"seed": 1}, top_k_logprobs=0, rows_with_overrides=0, note="n"
        ),
        quarantine={},
        quality=DedupFigures(
            dedup=True,
            dedup_fields="prompt",
            dedup_threshold=0.8,
            dedup_shingle=5,
            benchmarks=[],
            contamination_ngram=13,
        ),
        prompt_tokens=none,
        completion_tokens=none,
        min_judge_score=None,
        judged_rows=0,
        dropped_unjudged=0,
        dropped_below_score=0,
        languages=["en"],
    )
    return figures.model_copy(update=update)


def test_a_next_line_character_in_a_card_s_names_reads_back_from_its_yaml(tmp_path: Path) -> None:
    """PyYAML wrote U+0085 (NEL) raw inside a quoted string and read it back as a space: an
    inbox file, a model or a pretty name holding one was another name in the card's metadata."""
    source = _figures().sources[0].model_copy(update={"file": "q\x85a.jsonl"})
    figures = _figures(models=["teacher\x85v2"], sources=[source], quarantine={"x\x85y": 2})
    card = build_card(figures, CardOptions(pretty_name="Mes\x85réponses"))
    # As the export writes it (`save`), and as the Hub reads the file.
    card.save(tmp_path / "README.md")
    data = DatasetCard.load(tmp_path / "README.md").data.to_dict()
    assert DatasetCard(str(card)).data.to_dict() == data
    assert data["pretty_name"] == "Mes\x85réponses"
    assert data["kimi_batch"]["models"] == ["teacher\x85v2"]
    assert data["kimi_batch"]["sources"][0]["file"] == "q\x85a.jsonl"
    assert data["kimi_batch"]["quarantine"] == {"x\x85y": 2}


def test_a_line_or_paragraph_separator_in_a_card_s_names_is_escaped_in_its_yaml() -> None:
    """PyYAML wrote U+2028 and U+2029 raw in a single-quoted string and indented the rest after
    them: it reads that back without the indent, a YAML 1.2 reader (the Hub's) with it."""
    source = _figures().sources[0].model_copy(update={"file": "q\u2029a.jsonl"})
    figures = _figures(models=["teacher\u2028v2"], sources=[source], quarantine={"x\u2028y": 2})
    text = str(build_card(figures, CardOptions(pretty_name="Mes\u2029réponses")))
    assert not set(_front_matter(text)) & set(_YAML_11_BREAKS)
    assert "teacher\\Lv2" in _front_matter(text)  # YAML's escape of U+2028, in double quotes
    data = DatasetCard(text).data.to_dict()
    assert data["pretty_name"] == "Mes\u2029réponses"
    assert data["kimi_batch"]["models"] == ["teacher\u2028v2"]
    assert data["kimi_batch"]["sources"][0]["file"] == "q\u2029a.jsonl"
    assert data["kimi_batch"]["quarantine"] == {"x\u2028y": 2}


def test_a_line_break_in_the_pretty_name_keeps_the_card_s_heading_on_one_line() -> None:
    """The heading took the pretty name raw: its second line became the intro's first, and a
    "---" or "===" line under it another heading."""
    for title, read in [
        ("My\nanswers", "My answers"),
        ("My\r\n===\nanswers", "My === answers"),
        ("Answers #", "Answers \\#"),
        ("\n- list", "- list"),
    ]:
        text = DatasetCard(str(build_card(_figures(), CardOptions(pretty_name=title)))).text
        assert _heading_and_models(text) == (read, ["m"])


def test_a_backtick_or_a_line_break_in_a_model_name_keeps_its_code_span() -> None:
    """The Model bullet wrapped each name in single backticks: a backtick in a name ended its
    code span early (and began a stray one), a blank line in it ended the bullet."""
    models = ["a`b", "`x", "y``", "two\n\n# lines", " padded ", ""]
    text = DatasetCard(str(build_card(_figures(models=models), CardOptions()))).text
    heading, spans = _heading_and_models(text)
    assert spans == ["a`b", "`x", "y``", "two  # lines", " padded ", " "]
    assert heading == "Distilled answers of a`b, `x, y``, two  # lines,  padded , ".strip()


def test_a_pipe_or_a_line_break_in_a_card_cell_stays_in_its_cell() -> None:
    """A file, a benchmark or a reason holding `|` or a line break split its table row (a cell
    too many, or a row cut in two); each cell now escapes the pipe and keeps to one line."""
    source = _figures().sources[0].model_copy(update={"file": "q|a.jsonl"})
    quality = _figures().quality.model_copy(
        update={
            "benchmarks": ["bench|1.jsonl", "two\nlines.jsonl", "back\\|slash.jsonl"],
            "dedup_fields": "a\r\nb",
        }
    )
    figures = _figures(sources=[source], quality=quality, quarantine={"bad | row": 1, "x\ry": 2})
    text = DatasetCard(str(build_card(figures, CardOptions()))).text
    tables = list(_tables(text))
    for table in tables:
        width = _pipes(table[0])
        assert [_pipes(line) for line in table] == [width] * len(table)
    assert "| q\\|a.jsonl |" in text
    assert "| bad \\| row | 1 |" in text
    assert len(tables[3]) == 4  # the quarantine table: head, rule, two reasons


# ---- reasons, languages, token figures ----------------------------------------------------------

REASONS = st.one_of(
    TEXT,
    st.sampled_from(
        [
            "duplicate of seed-0 (exact prompt)",
            "near_duplicate of x (similarity 0.91)",
            "contaminated: bench.jsonl item q-7",
            "prompt is 912 tokens, over the limit of 512",
            "duplicate input id 'a|b' (first on line 3)",
            "answer cut off at max_tokens (finish_reason=length): not a final answer",
        ]
    ),
)


@EXAMPLES
@given(reasons=st.lists(REASONS, max_size=8))
def test_quarantine_counts_sum_to_the_reasons_under_stable_names(reasons: list[str]) -> None:
    counts = quarantine_counts(reasons)
    assert sum(counts.values()) == len(reasons)
    assert all(count > 0 for count in counts.values())
    assert counts == dict(Counter(reason_name(reason) for reason in reasons))
    for reason in reasons:
        name = reason_name(reason)
        # A name is its own name: counting named reasons again changes nothing.
        assert name
        assert reason_name(name) == name
        # No detail left: no number, no ':'; a reason's own spacing does not make another name.
        assert not re.search(r"\d", name)
        assert ":" not in name
        assert reason_name(f"  {reason}\n") == name


@EXAMPLES
@given(code=st.one_of(TEXT, st.text("abcdefghijklmnopqrstuvwxyzABC-", max_size=4)))
def test_a_language_code_is_a_lower_case_code_the_hub_knows(code: str) -> None:
    known = is_language_code(code)
    assert known == (
        code in ISO_639_1
        or code in {"code", "multilingual"}
        or bool(re.fullmatch(r"[a-z]{3}", code))
    )
    # What `--language` accepts is what the card may hold, in any case given.
    if code.isascii():
        try:
            checked = CardOptions(language=(code,)).check().language
        except ValueError:
            assert not is_language_code(code.lower())
        else:
            assert checked == (code.lower(),)
            assert is_language_code(code.lower())


# Any text, lone surrogates and combining marks included: a counter must never fail an export.
ANY_TEXT = st.text(
    st.one_of(st.characters(), st.sampled_from(_ODD + "\ud800\udfff\u0301\u0308ぁカ漢한Ωж")),
    max_size=40,
)


@EXAMPLES
@given(texts=st.lists(ANY_TEXT, max_size=5), split=st.integers(0, 5))
def test_the_guessed_languages_are_codes_with_a_share_of_the_letters(
    texts: list[str], split: int
) -> None:
    whole = ScriptCounter()
    whole.add(texts)
    guessed = whole.languages()
    assert len(set(guessed)) == len(guessed)
    assert all(is_language_code(code) for code in guessed)
    assert CardOptions(language=tuple(guessed)).check().language == tuple(guessed)
    # Fed in pieces or at once, the same languages.
    pieces = ScriptCounter()
    pieces.add(texts[:split])
    pieces.add(texts[split:])
    assert pieces.languages() == guessed
    letters = "".join(texts)
    if not any(char.isalpha() for char in letters):
        assert guessed == []


@EXAMPLES
@given(values=st.lists(st.integers(0, 1 << 62), max_size=50))
def test_token_figures_are_counts_that_occur(values: list[int]) -> None:
    stats = TokenStats.of(values)
    assert stats.count == len(values)
    if values:
        assert {stats.p50, stats.p95, stats.max} <= set(values)
        assert stats.p50 <= stats.p95 <= stats.max == max(values)
        assert min(values) - 0.01 <= stats.mean <= max(values) + 0.01
    else:
        assert stats == TokenStats(count=0, mean=0.0, p50=0, p95=0, max=0)
