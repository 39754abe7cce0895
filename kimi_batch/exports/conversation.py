"""Each answer as the conversation the teacher saw: system, user side, the answer.

The system turn is the digest the answer was generated under, byte for byte: a row carries its
digest's sha256, and the text is the one of a known digest file with that sha (the configured
`KIMI_BATCH_DIGEST`, plus any `--system FILE`). A row of an unknown digest is refused (a trainer
fed another system text than the teacher's learns another mapping), unless `--no-system`.

The user side is rebuilt from the input version the answer was made from (its
`input_sha256`): the seeds table's rows when they are of that version, else that version's
landed snapshot read again (`InputVersions`: a file re-landed, its distillation not rebuilt
yet); never another version's question (an answer whose version is gone fails the export,
naming it). It is rebuilt as `pipeline/distill.py` built the request: a seed's own messages (its
instructions already folded into the first user turn), or, for a variant, one user turn of the
seed's instructions folded in front of the variant's prompt (`engine.fold_instructions`). The
row's `prompt` alone would lose the instructions block and a seed's earlier turns.

A Batch API batch's answer (exported when `--source` names the batch) was asked as the client
wrote it: its line's messages, with the line's own system text as the digest (`batch_asked`,
from the batch's landed input).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.batch_api import ApiStore, batch_lines
from kimi_batch.engine import SystemDigest, fold_instructions
from kimi_batch.errors import ConfigError, MissingInputError
from kimi_batch.exports.selection import PartitionRows, is_batch_source
from kimi_batch.exports.shape import TrainingOptions, assistant_message, trainer_row
from kimi_batch.inputs import Landing, SeedPrompt, iter_inbox_rows
from kimi_batch.llama import TokenLogprob
from kimi_batch.pipeline import DistilledRow
from kimi_batch.settings import Settings
from kimi_batch.storage import StorageError


class ChatTurn(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    role: str
    content: str


class ExportExample(BaseModel):
    """One answer ready for a trainer: its conversation and the columns worth keeping."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    messages: list[ChatTurn]
    ds: str
    source: str
    request_id: str
    input_id: str
    seed_id: str
    origin: str
    strategy: str | None
    model: str
    digest_sha256: str
    input_sha256: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    finish_reason: str
    judge_score: int | None = Field(description="None: not judged.")
    logprobs: list[TokenLogprob] | None = Field(default=None, exclude=True)
    reasoning: str | None = Field(default=None, exclude=True)
    tool_calls: str | None = Field(default=None, exclude=True, description="OpenAI JSON.")
    tools: str | None = Field(default=None, exclude=True, description="The request's, JSON.")

    @property
    def system_text(self) -> str:
        """The digest's text as the conversation opens with it ('': an empty digest, which
        sends no system turn; `--no-system` exports have none either)."""
        first = self.messages[0]
        return first.content if first.role == "system" else ""

    def chat_line(self, options: TrainingOptions | None = None) -> str:
        """The row `options` lay out (`exports.shape`): by default `{"messages": [...]}` with
        the reasoning and tool calls on the assistant message, what TRL's SFTTrainer reads."""
        return _dumps(self.trainer_row(options or TrainingOptions()))

    def trainer_row(self, options: TrainingOptions) -> dict[str, object]:
        """The example as a trainer's row (`exports.trainer_row`)."""
        *asked, answer = self._messages()
        message = assistant_message(answer["content"], self.reasoning, self.tool_calls, options)
        return trainer_row(
            asked, message, digest_sha256=self.digest_sha256, tools=self.tools, options=options
        )

    def _messages(self) -> list[dict[str, str]]:
        return [turn.model_dump() for turn in self.messages]


def _dumps(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class SystemTexts:
    """The system text of each known digest, by sha256; `omit`: no system turn at all."""

    def __init__(self, digests: Sequence[SystemDigest], *, omit: bool = False) -> None:
        self._digests = list(digests)
        self._by_sha = {digest.sha256: digest for digest in digests}
        self._omit = omit
        self._current = digests[0] if digests else None

    def with_digests(self, digests: Sequence[SystemDigest]) -> SystemTexts:
        """These texts and `digests` (a batch's own system prompts)."""
        return SystemTexts([*self._digests, *digests], omit=self._omit)

    def turn(self, answer: DistilledRow) -> list[ChatTurn]:
        if self._omit:
            return []
        digest = self._by_sha.get(answer.digest_sha256)
        if digest is None:
            current = (
                f"the digest {self._current.path} is {self._current.sha256[:12]}"
                if self._current
                else "no digest file is known"
            )
            raise ConfigError(
                f"answer {answer.request_id} was generated under system digest "
                f"{answer.digest_sha256[:12]}, and {current}: pass that digest's file with "
                "--system FILE, or export without a system turn with --no-system"
            )
        # An empty digest sent no system turn (engine.assemble_messages): none here either.
        return [ChatTurn(role="system", content=digest.text)] if digest.text else []


class Asked(BaseModel):
    """What a Batch API batch's lines asked: user-side turns by `custom_id`, the system texts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    turns: dict[str, list[ChatTurn]]
    systems: list[SystemDigest]
    tools: dict[str, str] = Field(default_factory=dict, description="JSON, by `custom_id`.")


def batch_asked(settings: Settings, batch_id: str) -> Asked:
    """The batch's requests as its landed input holds them (what the run answered)."""
    with ApiStore(settings.paths) as store:
        batch = store.batch(batch_id)
    if batch is None:
        raise MissingInputError(f"no Batch API batch {batch_id} in this state directory")
    lines = batch_lines(settings, batch)
    return Asked(
        turns={
            line.custom_id: [ChatTurn(role=m.role, content=m.content) for m in line.messages]
            for line in lines
        },
        systems=[SystemDigest.from_text(text) for text in {line.system for line in lines}],
        tools={line.custom_id: _dumps(line.params.tools) for line in lines if line.params.tools},
    )


class _Seed(BaseModel):
    """What an answer's user side is rebuilt from: a seed's messages and its instructions."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    messages: list[ChatTurn]
    instructions: str | None


class InputVersions:
    """The seeds of the landed input versions answers were made from, read from their
    snapshots: a partition whose file was re-landed and whose distillation is not rebuilt yet
    has seeds of the new version and answers of the old one (one partition's at a time)."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._partition: tuple[str, str] | None = None
        self._seeds: dict[str, dict[str, _Seed] | None] = {}

    def seed(self, ds: str, source: str, input_sha256: str, seed_id: str) -> _Seed | None:
        """Seed `seed_id` of version `input_sha256` of the partition; None when that version
        is not landed here or does not hold it."""
        if self._partition != (ds, source):
            self._partition, self._seeds = (ds, source), {}
        if input_sha256 not in self._seeds:
            self._seeds[input_sha256] = self._read(ds, source, input_sha256)
        return (self._seeds[input_sha256] or {}).get(seed_id)

    def _read(self, ds: str, source: str, input_sha256: str) -> dict[str, _Seed] | None:
        with Landing(self._settings.paths) as landing:
            try:
                version = landing.version(ds, source, input_sha256)
            except StorageError:
                return None  # its snapshot is gone from every host
        if version is None:
            return None
        # Read as the seeds stage read it (its inbox name), so rows without an id get the
        # same content-hash ids.
        rows = iter_inbox_rows(
            version.path,
            source_name=version.name,
            max_input_bytes=self._settings.max_input_bytes,
        )
        return {
            row.input_id: _Seed(
                messages=[ChatTurn(role=m.role, content=m.content) for m in row.messages],
                instructions=row.instructions,
            )
            for row in rows
            if isinstance(row, SeedPrompt)
        }


def _seed_of(answer: DistilledRow, rows: PartitionRows, versions: InputVersions | None) -> _Seed:
    """The seed the answer was made from: the seeds table's when it is of the answer's input
    version, else that version's (`versions`); MissingInputError when neither has it."""
    seed = rows.seeds.get(answer.seed_id)
    # An answer written before rows carried their input version ("") can only take the table's.
    if seed is not None and answer.input_sha256 in (seed.input_sha256, ""):
        turns = [ChatTurn(role=m.role, content=m.content) for m in seed.messages]
        return _Seed(messages=turns, instructions=seed.instructions)
    older = (
        versions.seed(rows.ds, rows.source, answer.input_sha256, answer.seed_id)
        if versions is not None
        else None
    )
    if older is None:
        raise MissingInputError(
            f"answer {answer.request_id} (ds={rows.ds} source={rows.source}) has no seed "
            f"{answer.seed_id!r} of its input version {answer.input_sha256[:12]} in the seeds "
            "table or the landed snapshots: its seeds were removed; rebuild the partition"
        )
    return older


def _user_side(answer: DistilledRow, seed: _Seed) -> list[ChatTurn]:
    if answer.origin == "seed":
        return seed.messages
    return [ChatTurn(role="user", content=fold_instructions(seed.instructions, answer.prompt))]


def examples(
    rows: PartitionRows,
    system: SystemTexts,
    asked: Asked | None = None,
    versions: InputVersions | None = None,
) -> list[ExportExample]:
    """Every answer of the partition as an example, in the table's order, its user side from
    the input version it was made from (`versions`: the older ones' snapshots); `asked`: a
    Batch API batch's requests (its answers have no seeds)."""
    if asked is not None:
        system = system.with_digests(asked.systems)
    turns_by_id = asked.turns if asked is not None else {}
    built: list[ExportExample] = []
    for answer in rows.answers:
        if answer.seed_id in turns_by_id:
            user = turns_by_id[answer.seed_id]
        else:
            user = _user_side(answer, _seed_of(answer, rows, versions))
        turns = [*system.turn(answer), *user, ChatTurn(role="assistant", content=answer.response)]
        columns = answer.model_dump(include=_COLUMNS)
        # A batch answered before rows kept their request's tools: its landed line has them.
        if columns.get("tools") is None and asked is not None:
            columns["tools"] = asked.tools.get(answer.seed_id)
        built.append(
            ExportExample(
                messages=turns,
                ds=rows.ds,
                source=rows.source,
                judge_score=rows.score(answer),
                **columns,
            )
        )
    return built


_COLUMNS = set(ExportExample.model_fields) - {"messages", "ds", "source", "judge_score"}

BuildExamples = Callable[[PartitionRows], list[ExportExample]]


def example_builder(settings: Settings, system: SystemTexts) -> BuildExamples:
    """`examples` of each partition, a Batch API batch's with what its lines asked, older
    input versions read from their snapshots."""
    versions = InputVersions(settings)

    def build(rows: PartitionRows) -> list[ExportExample]:
        asked = batch_asked(settings, rows.source) if is_batch_source(rows.source) else None
        return examples(rows, system, asked, versions)

    return build
