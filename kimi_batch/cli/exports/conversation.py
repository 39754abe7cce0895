"""Each answer as the conversation the teacher saw: system, user side, the answer.

The system turn is the digest the answer was generated under, byte for byte: a row carries its
digest's sha256, and the text is the one of a known digest file with that sha (the configured
`KIMI_BATCH_DIGEST`, plus any `--system FILE`). A row of an unknown digest is refused (a trainer
fed another system text than the teacher's learns another mapping), unless `--no-system`.

The user side is rebuilt as `tasks/distill.py` built the request: a seed's own messages (its
instructions already folded into the first user turn), or, for a variant, one user turn of the
seed's instructions folded in front of the variant's prompt (`engine.fold_instructions`). The
row's `prompt` alone would lose the instructions block and a seed's earlier turns.

A Batch API batch's answer (exported when `--source` names the batch) was asked as the client
wrote it: its line's messages, with the line's own system text as the digest (`batch_asked`,
from the batch's landed input).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.cli.exports.selection import PartitionRows, is_batch_source
from kimi_batch.engine import SystemDigest, fold_instructions
from kimi_batch.errors import ConfigError, MissingInputError
from kimi_batch.llama import TokenLogprob
from kimi_batch.settings import Settings
from kimi_batch.storage import ApiStore, batch_lines
from kimi_batch.tasks.rows import DistilledRow, SeedRow

__all__ = [
    "Asked",
    "BuildExamples",
    "ChatTurn",
    "ExportExample",
    "SystemTexts",
    "batch_asked",
    "example_builder",
    "examples",
]


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

    def chat_line(self) -> str:
        """`{"messages": [...]}`: what TRL's SFTTrainer and axolotl's chat datasets read."""
        return _dumps({"messages": self._messages()})

    def kd_line(self) -> str:
        """The conversation plus the answer's tokens with their top-k alternatives, in OpenAI's
        `logprobs.content` shape."""
        content = [
            {
                "token": token.token,
                "logprob": token.logprob,
                "top_logprobs": [{"token": t.token, "logprob": t.logprob} for t in token.top],
            }
            for token in self.logprobs or []
        ]
        return _dumps(
            {
                "messages": self._messages(),
                "request_id": self.request_id,
                "model": self.model,
                "top_k": max((len(token.top) for token in self.logprobs or []), default=0),
                "logprobs": {"content": content},
            }
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
    )


def _user_side(
    answer: DistilledRow, seed: SeedRow | None, where: str, asked: Mapping[str, list[ChatTurn]]
) -> list[ChatTurn]:
    if answer.seed_id in asked:
        return asked[answer.seed_id]
    if seed is None:
        raise MissingInputError(
            f"answer {answer.request_id} ({where}) has no seed {answer.seed_id!r} in the seeds "
            "table: its partition is stale or its seeds were removed; rebuild the partition"
        )
    if answer.origin == "seed":
        return [ChatTurn(role=m.role, content=m.content) for m in seed.messages]
    return [ChatTurn(role="user", content=fold_instructions(seed.instructions, answer.prompt))]


def examples(
    rows: PartitionRows, system: SystemTexts, asked: Asked | None = None
) -> list[ExportExample]:
    """Every answer of the partition as an example, in the table's order; `asked`: a Batch
    API batch's requests (its answers have no seeds)."""
    where = f"ds={rows.ds} source={rows.source}"
    if asked is not None:
        system = system.with_digests(asked.systems)
    turns_by_id = asked.turns if asked is not None else {}
    built: list[ExportExample] = []
    for answer in rows.answers:
        turns = [
            *system.turn(answer),
            *_user_side(answer, rows.seeds.get(answer.seed_id), where, turns_by_id),
            ChatTurn(role="assistant", content=answer.response),
        ]
        built.append(
            ExportExample(
                messages=turns,
                ds=rows.ds,
                source=rows.source,
                judge_score=rows.score(answer),
                **answer.model_dump(include=_COLUMNS),
            )
        )
    return built


_COLUMNS = set(ExportExample.model_fields) - {"messages", "ds", "source", "judge_score"}

BuildExamples = Callable[[PartitionRows], list[ExportExample]]


def example_builder(settings: Settings, system: SystemTexts) -> BuildExamples:
    """`examples` of each partition, a Batch API batch's with what its lines asked."""

    def build(rows: PartitionRows) -> list[ExportExample]:
        asked = batch_asked(settings, rows.source) if is_batch_source(rows.source) else None
        return examples(rows, system, asked)

    return build
