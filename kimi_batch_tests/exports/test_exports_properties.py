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
  figures and options it was given, and every table row of the body has its header's cells, for
  any model name, file name, reason, pretty name (YAML and Markdown syntax, line breaks).
- `reason_name`, `quarantine_counts`, `is_language_code`, `ScriptCounter`, `TokenStats.of` on
  any text or numbers.

Everything is built through the project's own models (`DistilledRow`, `SeedRow`, `SystemDigest`,
`PartitionRows`, `CardFigures`). The `hf` property writes into one embedded warehouse's home
(SQLite catalog, no server), each example to its own folder.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from huggingface_hub import DatasetCard

from kimi_batch.exports import (
    CardFigures,
    CardOptions,
    DedupFigures,
    InputSource,
    SamplingFigures,
    TokenStats,
    build_card,
)


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


def _pipes(line: str) -> int:
    """The cell boundaries of a Markdown table row: its pipes not escaped by a backslash."""
    count, escaped = 0, False
    for char in line:
        count += char == "|" and not escaped
        escaped = char == "\\" and not escaped
    return count


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
