"""The one stage registry: every generation stage, declared once (its task, its run config, what
it reads), and the tasks the layers below know by name.

`declare_stage(...)` is the one line a stage needs besides its class. Everything that lists
stages reads this module, in declaration order (which is also the order the stages read each
other in): the Dagster adapter builds one asset a declaration (`defs/assets/batch.py`), the
nightly job's stages and run config (`defs/assets/night.py`), the jobs' selections, the checks
the alerts watch; the night's end (`night_end`: what "the night is done" means to the schedule,
the partition states, the freshness check and the alerts); the tables (`STAGES`: warehouse's
`TABLES`, the ledger rows of `kimi-batch status`, the export), the demo and the bench.

A stage's run config is a fixed pydantic class (`StageConfig`: its `task(settings)` builds the
task); Dagster's run-config schema is derived from it by the adapter, never by rewriting a
function's annotations. The registry is read when definitions are built, not when modules
import: a stage declared before `kimi_batch.definitions.build_definitions` runs is in the code
location it builds.

`seed_prompts` (the landed inputs) is not a generation stage: stages read it as `SEED_ASSET`.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, SkipValidation, field_validator

from kimi_batch.batch_api import ApiBatchTask
from kimi_batch.engine import SamplingParams
from kimi_batch.pipeline.amplify import DEFAULT_AMPLIFY_PARAMS, AmplifyTask, Strategy
from kimi_batch.pipeline.distill import DistillTask
from kimi_batch.pipeline.driver import StageConfigError
from kimi_batch.pipeline.generation_task import GenerationTask, RequestTag
from kimi_batch.pipeline.judge import DEFAULT_JUDGE_PARAMS, JudgeTask
from kimi_batch.pipeline.schemas import import_output_model
from kimi_batch.settings import Settings

Task = GenerationTask[Any, Any]
TaskT = TypeVar("TaskT", bound=type[GenerationTask[Any, Any]])
SEED_ASSET = "seed_prompts"
SEED_TABLES = ("seeds", "quarantine")
_RESERVED_TABLES = frozenset(SEED_TABLES)


class StageConfig(BaseModel):
    """Run config of a stage (the launchpad shows its fields); it builds the stage's task."""

    model_config = ConfigDict(extra="forbid")

    def task(self, settings: Settings) -> Task:
        raise NotImplementedError(f"{type(self).__name__} must build its stage's task")


class StageDeclaration(BaseModel):
    """Everything the code location needs to know of one generation stage."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    asset: str = Field(pattern=r"^[a-z][a-z0-9_]*$", description="The asset's name.")
    # Pydantic cannot check a subclass of a parametrized generic: `_is_a_task` does.
    task: SkipValidation[type[Task]] = Field(
        description="The stage's class (its name, table and row model)."
    )
    config: type[StageConfig] | None = Field(
        default=None,
        description="Its run config class (its `task(settings)` builds the task); None: the "
        "task's defaults, no run config.",
    )
    reads: tuple[str, ...] = Field(
        default=(SEED_ASSET,),
        description="The assets it reads: `seed_prompts` or stages declared before it.",
    )
    description: str = Field(min_length=1, description="The asset's description.")
    nightly: bool = Field(default=True, description="The nightly job runs it.")
    ingest: bool = Field(
        default=False, description="The inbox sensor's ingest_job runs it after the seeds."
    )
    night_field: str = Field(
        default="",
        pattern=r"^([a-z][a-z0-9_]*)?$",
        description="Its field in the night's run config; empty: the task's name.",
    )
    switch: str = Field(
        default="",
        description="A boolean `Settings` field that turns the stage on in the night and the "
        "demo (`batch_job` leaves it out; its asset is always there to materialize by hand); "
        "empty: always on.",
    )

    @field_validator("switch")
    @classmethod
    def _is_a_switch(cls, switch: str) -> str:
        field = Settings.model_fields.get(switch)
        if switch and (field is None or field.annotation is not bool):
            raise ValueError(f"{switch!r} is not a boolean Settings field")
        return switch

    def enabled(self, settings: Settings) -> bool:
        """Whether the night and the demo run it under `settings`."""
        return not self.switch or bool(getattr(settings, self.switch))

    @field_validator("task")
    @classmethod
    def _is_a_task(cls, task: object) -> object:
        if not (isinstance(task, type) and issubclass(task, GenerationTask)):
            raise ValueError(f"{task!r} is not a GenerationTask class")
        return task

    @property
    def table(self) -> str:
        return self.task.table

    @property
    def tables(self) -> tuple[str, ...]:
        """The tables its asset writes (its own and the quarantine)."""
        return (self.task.table, "quarantine")

    @property
    def config_field(self) -> str:
        return self.night_field or self.task.name

    def build(self, config: StageConfig | None, settings: Settings) -> Task:
        """The stage's task from its run config (the task's defaults when it has none)."""
        return config.task(settings) if config is not None else self.task()


_DECLARATIONS: dict[str, StageDeclaration] = {}
STAGE_DECLARATIONS: Mapping[str, StageDeclaration] = types.MappingProxyType(_DECLARATIONS)
"""Asset name -> declaration, in declaration order (a live, read-only view)."""
_STAGES: dict[str, type[Task]] = {}
STAGES: Mapping[str, type[Task]] = types.MappingProxyType(_STAGES)
"""Stage name -> stage class, in registration order (a live, read-only view): every declared
stage's, and the Batch API's (its asset is one partition a batch, not a declaration)."""


def _register(task: TaskT) -> TaskT:
    """Make a stage's class known by its name (idempotent).

    Stages may share a table when they share its row model (the Batch API's answers are
    `distilled` rows); ValueError when another stage has the name, or the table with another
    row model.
    """
    known = _STAGES.get(task.name)
    if known is task:
        return task
    if known is not None:
        raise ValueError(f"stage {task.name!r} is already {known.__name__}")
    if task.table in _RESERVED_TABLES:
        raise ValueError(f"table {task.table!r} of stage {task.name!r} is not a stage's table")
    for other in _STAGES.values():
        if other.table == task.table and other.row_model is not task.row_model:
            raise ValueError(
                f"table {task.table!r} of stage {task.name!r} is {other.name!r}'s, with rows "
                f"{other.row_model.__name__}, not {task.row_model.__name__}"
            )
    _STAGES[task.name] = task
    return task


def stage_of_tag(tag: str) -> type[Task] | None:
    """The registered stage whose request carried `tag` (a ledger row's), or None."""
    try:
        return _STAGES.get(RequestTag.parse(tag).stage)
    except ValueError:
        return None


def declare_stage(**fields: Any) -> StageDeclaration:
    """Declare a stage (the fields of `StageDeclaration`); declaring the same one again is a
    no-op. ValueError when its asset or night field is another stage's, or it reads an asset
    not declared before it."""
    declaration = StageDeclaration(**fields)
    known = _DECLARATIONS.get(declaration.asset)
    if known is not None and known == declaration:
        return known
    if known is not None:
        raise ValueError(f"stage asset {declaration.asset!r} is declared already")
    for asset in declaration.reads:
        if asset != SEED_ASSET and asset not in _DECLARATIONS:
            raise ValueError(f"{declaration.asset!r} reads {asset!r}, which is not declared")
    if any(d.config_field == declaration.config_field for d in _DECLARATIONS.values()):
        raise ValueError(f"night field {declaration.config_field!r} is another stage's")
    _register(declaration.task)
    _DECLARATIONS[declaration.asset] = declaration
    return declaration


def withdraw_stage(asset: str) -> None:
    """Forget a declared stage and its task's registration (a test's own stage)."""
    if any(asset in d.reads for d in _DECLARATIONS.values()):
        raise ValueError(f"another stage reads {asset!r}")
    declaration = _DECLARATIONS.pop(asset, None)
    if declaration is not None and _STAGES.get(declaration.task.name) is declaration.task:
        del _STAGES[declaration.task.name]


def nightly_stages(settings: Settings | None = None) -> list[StageDeclaration]:
    """The stages the nightly job runs, in declaration order: with `settings`, only those
    switched on (without, every stage it may run: its run config has a field for each)."""
    return [
        d for d in _DECLARATIONS.values() if d.nightly and (settings is None or d.enabled(settings))
    ]


def night_end() -> StageDeclaration:
    """The stage whose partitions, built, make the night done: the last nightly stage no setting
    switches on. The schedule asks for the partitions it lacks, their states and the freshness
    check are its; a stage a setting switches on (the judge) follows it when on, and holds up
    nothing when off."""
    always = [d for d in nightly_stages() if not d.switch]
    if not always:
        raise LookupError("no nightly stage is declared")
    return always[-1]


def upstream_of(asset: str) -> list[str]:
    """Every asset `asset` reads, directly or through the stages it reads, nearest last."""
    found: list[str] = []
    for read in STAGE_DECLARATIONS[asset].reads if asset in _DECLARATIONS else ():
        for name in (*upstream_of(read), read):
            if name not in found:
                found.append(name)
    return found


AMPLIFY_MAX_TOKENS = DEFAULT_AMPLIFY_PARAMS.max_tokens


class AmplifyConfig(StageConfig):
    strategies: list[str] = Field(default_factory=lambda: [s.value for s in Strategy])
    variants_per_strategy: int = Field(default=1, ge=1, le=16)
    max_tokens: int | None = Field(
        default=None,
        gt=0,
        description=f"Budget of one variant in tokens; unset: {AMPLIFY_MAX_TOKENS}, or the "
        "server's n_predict (KIMI_BATCH_LLAMA_N_PREDICT) when that is smaller.",
    )
    temperature: float = Field(default=0.9, ge=0.0, le=2.0)
    seed: int = Field(default=7, description="Base sampling seed: reruns ask the same questions.")

    def task(self, settings: Settings) -> AmplifyTask:
        # llama-server lets a request's max_tokens exceed its --n-predict: the cap is ours.
        budget = self.max_tokens or min(AMPLIFY_MAX_TOKENS, settings.llama_n_predict)
        params = SamplingParams(max_tokens=budget, temperature=self.temperature, seed=self.seed)
        strategies = [Strategy(s) for s in self.strategies]
        return AmplifyTask(strategies=strategies, k=self.variants_per_strategy, params=params)


class DistillConfig(StageConfig):
    max_tokens: int | None = Field(
        default=None,
        gt=0,
        description="Answer budget in tokens; unset: the server's n_predict "
        "(KIMI_BATCH_LLAMA_N_PREDICT, 1024), which a reasoning model needs to think and answer.",
    )
    temperature: float = Field(default=0.7, ge=0.0, le=2.0)
    seed: int = Field(default=11)
    n_probs: int = Field(default=0, ge=0, le=20, description="Top-k logprobs per token (0: off).")
    output_model: str | None = Field(
        default=None,
        description="'package.module:Model' of a pydantic model: the answer is constrained to its "
        "JSON schema and validated; answers that do not validate go to quarantine. Only "
        "modules the deployment allows (KIMI_BATCH_OUTPUT_MODEL_MODULES) can be named.",
    )
    retry_truncated_max_tokens: int | None = Field(
        default=None,
        gt=0,
        description="Ask again, with this budget, for answers cut off at max_tokens (they are "
        "never final answers); unset: they go to quarantine.",
    )

    def sampling(self, n_predict: int) -> SamplingParams:
        """The answers' sampling; the budget is the server's `n_predict` unless set here."""
        return SamplingParams(
            max_tokens=self.max_tokens or n_predict, temperature=self.temperature, seed=self.seed
        )

    def task(self, settings: Settings) -> DistillTask:
        try:
            output_model = (
                import_output_model(self.output_model, settings.output_model_modules)
                if self.output_model
                else None
            )
        except ValueError as error:
            raise StageConfigError(str(error)) from error
        return DistillTask(
            params=self.sampling(settings.llama_n_predict),
            n_probs=self.n_probs,
            output_model=output_model,
            retry_truncated_max_tokens=self.retry_truncated_max_tokens,
        )


AMPLIFY = declare_stage(
    asset="amplified_prompts",
    task=AmplifyTask,
    config=AmplifyConfig,
    description="New training prompts: k paraphrased, harder and related variants per seed, "
    "deduplicated.",
    ingest=True,
    night_field="amplification",
)
DISTILL = declare_stage(
    asset="distilled_responses",
    task=DistillTask,
    config=DistillConfig,
    reads=(SEED_ASSET, AMPLIFY.asset),
    description="Teacher answers for every seed and variant, with token counts, cache hits "
    "and timings.",
    night_field="distillation",
)


class JudgeConfig(StageConfig):
    max_tokens: int = Field(
        default=DEFAULT_JUDGE_PARAMS.max_tokens,
        gt=0,
        description="Budget of one verdict in tokens (a score and one sentence).",
    )

    def task(self, settings: Settings) -> JudgeTask:
        try:
            rubric = settings.judge_rubric.read_text(encoding="utf-8")
        except OSError as error:
            raise StageConfigError(f"judge rubric {settings.judge_rubric}: {error}") from error
        params = DEFAULT_JUDGE_PARAMS.model_copy(update={"max_tokens": self.max_tokens})
        return JudgeTask(rubric=rubric, params=params)


JUDGE = declare_stage(
    asset="judged_answers",
    task=JudgeTask,
    config=JudgeConfig,
    reads=(DISTILL.asset,),
    description="A 1-10 score and a reason for every teacher answer, by the same model against "
    "the rubric (the night runs it when KIMI_BATCH_JUDGE_NIGHTLY=on).",
    night_field="judging",
    switch="judge_nightly",
)

# The Batch API's stage: its asset is one partition a batch (`defs/assets/api_batch.py`).
_register(ApiBatchTask)
