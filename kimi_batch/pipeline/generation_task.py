"""The generation-stage protocol: what differs between amplify, distill and any later stage.

A stage says which table it fills (`table`, `row_model`), what it reads (`load`), what it asks
(`requests`, like curator's `LLM.prompt` or distilabel's `Task.format_input`) and what a finished
request becomes (`parse`, like `LLM.parse` / `Task.format_output`): a row, or a `SetAside` with
the reason. Everything else is shared and the stage never sees it: the engine, the ledger (a
rerun sends only what it lacks), the partition lease, `StageSink` (quarantine rows and the
figures the checks judge), and streaming the rows from the ledger to Parquet in chunks.

What a request is, in its stage's terms: the typed `RequestTag`, and its one wire form.

The engine carries a request's tag as an opaque string (`GenerationRequest.tag`) into its result
and the ledger; only this module writes or reads that string. The wire forms of amplify and
distill are the ones ledgers already hold (a ledger key never depends on the tag, but
`kimi-batch status` counts ledger rows per table by it):

    amplify  seed, strategy S   ->  "S"              (e.g. "paraphrase")
    distill  seed               ->  "seed"
    distill  variant of S       ->  "variant:S"
    any other stage             ->  "STAGE/ORIGIN" or "STAGE/ORIGIN:S"
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping, Sequence
from enum import StrEnum
from functools import cached_property
from typing import ClassVar, Generic, Literal, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.engine import GenerationRequest, GenerationResult
from kimi_batch.inputs import SeedPrompt, seeds_from_rows
from kimi_batch.pipeline.rows import GenerationColumns, SeedRow

# ---- what a request is in its stage's terms (`RequestTag`) --------------------------------------


AMPLIFY_STAGE = "amplify"
DISTILL_STAGE = "distill"

Origin = Literal["seed", "variant"]


class Strategy(StrEnum):
    """How a variant relates to its seed; the value is the `strategy` column."""

    PARAPHRASE = "paraphrase"
    HARDER = "harder"
    RELATED = "related"


_STRATEGIES = frozenset(strategy.value for strategy in Strategy)
_SEED = "seed"
_STAGE = re.compile(r"^[a-z_][a-z0-9_]*$")
_VARIANT_PREFIX = "variant:"


class RequestTag(BaseModel):
    """The stage a request belongs to, and what its input was (a seed, or a variant of one)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stage: str = Field(pattern=_STAGE.pattern, description="The stage's `name`.")
    origin: Origin = Field(default="seed", description="The input: a seed or a variant.")
    strategy: Strategy | None = Field(
        default=None, description="Amplify: the strategy asked for; distill: the variant's."
    )

    @property
    def wire(self) -> str:
        """The string the engine carries (`GenerationRequest.tag`)."""
        strategy = self.strategy.value if self.strategy else None
        if self.stage == AMPLIFY_STAGE and self.origin == "seed" and strategy:
            return strategy
        if self.stage == DISTILL_STAGE and self.origin == "seed" and strategy is None:
            return _SEED
        if self.stage == DISTILL_STAGE and self.origin == "variant" and strategy:
            return f"{_VARIANT_PREFIX}{strategy}"
        return f"{self.stage}/{self.origin}" + (f":{strategy}" if strategy else "")

    @classmethod
    def parse(cls, wire: str) -> RequestTag:
        """The tag of a wire string; ValueError on a string no stage writes."""
        if wire == _SEED:
            return cls(stage=DISTILL_STAGE)
        if wire.startswith(_VARIANT_PREFIX):
            strategy = wire.removeprefix(_VARIANT_PREFIX)
            if strategy in _STRATEGIES:
                return cls(stage=DISTILL_STAGE, origin="variant", strategy=Strategy(strategy))
        elif wire in _STRATEGIES:
            return cls(stage=AMPLIFY_STAGE, strategy=Strategy(wire))
        elif "/" in wire:
            stage, _, rest = wire.partition("/")
            origin, _, strategy = rest.partition(":")
            known = origin in ("seed", "variant") and (not strategy or strategy in _STRATEGIES)
            if known and _STAGE.fullmatch(stage):
                tag = cls.model_validate(
                    {"stage": stage, "origin": origin, "strategy": strategy or None}
                )
                # Only the one form each tag is written in ("distill/seed" is "seed", "x/seed:"
                # is "x/seed"): a string no stage writes is no tag.
                if tag.wire == wire:
                    return tag
        raise ValueError(f"not a request tag: {wire!r}")


# ---- the stage protocol -------------------------------------------------------------------------


InputsT = TypeVar("InputsT")
RowT = TypeVar("RowT", bound=GenerationColumns)
ReadT = TypeVar("ReadT", bound=BaseModel)


class ScreenedText(BaseModel):
    """What the quality gate judges a row on: the conversation the answer is to (its user side,
    every turn, the row's instructions folded in), the answer, and the input line it came from.

    Benchmark overlap is looked for in the whole conversation (`prompt`). Duplicates are its
    last question (`question`) under the same instructions, earlier turns (`context`) and tools
    offered (`tools`): a long shared context (a document asked about many times, one system
    text on every row) must not make different questions alike, nor one question asked with
    other tools the same. The answer is its text and its tool calls (`tool_calls`): an answer
    that only calls a tool has no text, and two that call different tools differ."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt: str
    answer: str
    source_file: str
    line: int | None = None
    question: str | None = Field(default=None, description="None: the whole `prompt`.")
    context: tuple[str, ...] = Field(
        default=(), description="The instructions and each earlier turn, in order."
    )
    tools: str | None = Field(
        default=None, description="The tools offered, as canonical JSON; None: none."
    )
    tool_calls: tuple[str, ...] = Field(
        default=(),
        description="The answer's tool calls, each its function's name and arguments as "
        "canonical JSON (not its id, new on every call).",
    )


class RowReader(Protocol):
    """Reads one table of the partition being generated (what a stage's inputs come from)."""

    def __call__(self, table: str, model: type[ReadT], /) -> list[ReadT]: ...


class SetAside(BaseModel):
    """A finished request that is not a row: it goes to the quarantine table with the reason."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reason: str = Field(min_length=1)
    source_file: str = Field(description="The input file the request was built from.")
    line: int | None = Field(default=None, description="Its line there, if known.")


class SeedInputs(BaseModel):
    """The partition's landed seeds, by id: the inputs of a stage that reads only `seeds`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seeds: list[SeedPrompt]

    @classmethod
    def read(cls, read: RowReader) -> SeedInputs:
        return cls(seeds=seeds_from_rows(read("seeds", SeedRow)))

    @cached_property
    def by_id(self) -> dict[str, SeedPrompt]:
        return {seed.input_id: seed for seed in self.seeds}

    def seed_of(self, result: GenerationResult) -> SeedPrompt:
        """The seed a result was asked for; a result of no seed is a caller bug (ValueError)."""
        seed = self.by_id.get(result.input_id)
        if seed is None:
            raise ValueError(f"result {result.request_id} is for unknown seed {result.input_id!r}")
        return seed


def generation_columns(result: GenerationResult) -> dict[str, object]:
    """The contract columns of an output row, taken from its result (every stage's rows)."""
    return result.model_dump(include=set(GenerationColumns.model_fields))


class GenerationTask(BaseModel, ABC, Generic[InputsT, RowT]):
    """One generation stage. Subclasses set the class variables and implement the three methods;
    their fields are the stage's options (sampling, k, an output schema ...).

    Ledger guarantee: a request's ledger key is a hash of (digest, model, params, messages)
    and, when its answer is not determined (no fixed seed, temperature above 0), of its sample:
    the partition it is planned in and its `input_id`. `requests` must build the same requests
    with the same input ids from the same inputs on every rerun.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    name: ClassVar[str]
    """The stage: the quarantine rows' `stage` and the tags' `RequestTag.stage`."""
    table: ClassVar[str]
    """The output table (Parquet directory and Trino table)."""
    row_model: ClassVar[type[GenerationColumns]]
    """The table's row model (its schema)."""
    dropped_metric: ClassVar[str | None] = None
    """Metadata name of the count of rows `keep` drops, when the stage drops any."""
    quality_gated: ClassVar[bool] = False
    """Whether its rows pass the quality gate as they land (benchmark contamination, duplicates
    across nights; `screened` says what it reads): the rows a student is trained on."""

    @abstractmethod
    def load(self, read: RowReader) -> InputsT:
        """The stage's inputs from the partition's upstream tables."""

    @abstractmethod
    def requests(self, inputs: InputsT) -> Sequence[GenerationRequest]:
        """The requests to run, deterministic across reruns (tag: a `RequestTag`'s wire form)."""

    @abstractmethod
    def parse(self, result: GenerationResult, inputs: InputsT) -> RowT | SetAside:
        """A finished request as a row, or set aside with the reason."""

    def order(self, results: Iterable[GenerationResult]) -> Iterable[GenerationResult]:
        """The order results are parsed in; the default streams them in request order."""
        return results

    def keep(self, rows: Iterable[RowT], inputs: InputsT) -> Iterator[RowT]:
        """The rows that go into the table (e.g. without duplicates); the default keeps all."""
        yield from rows

    def measure(self, row: RowT) -> Mapping[str, float]:
        """Numbers of one kept row that the partition's metadata sums (the judge: its score)."""
        return {}

    def summarize(self, sums: Mapping[str, float], rows: int) -> dict[str, float]:
        """The partition's metadata from the sums of `measure` over its `rows` kept rows."""
        return dict(sums)

    def screened(self, row: RowT, inputs: InputsT) -> ScreenedText:
        """What the quality gate reads of a kept row (the `quality_gated` stages' rows)."""
        raise NotImplementedError(f"the {self.name} stage's rows are not quality gated")

    @property
    def asks_again(self) -> bool:
        """Whether `retry` may return a request: the results are then read twice."""
        return False

    def retry(
        self, request: GenerationRequest, result: GenerationResult
    ) -> GenerationRequest | None:
        """A request to send instead of one whose result is not good enough (None: keep it)."""
        return None
