"""The generation stages, each declared once: its task, its run config, its asset, what it reads.

`declare_stage(...)` is the one line a stage needs besides its class. Everything that lists
stages reads `STAGE_DECLARATIONS` (declaration order, which is also the order the stages read
each other in): the batch assets (`defs/assets/batch.py`, one `generation_asset` a declaration),
the nightly job (`defs/assets/night.py`: every nightly stage in order, with its config field),
the jobs' selections (`defs/jobs.py`), the checks the alerts watch (`defs/check_states.py`),
the demo and the bench; `declare_stage` also registers the task for the layers below (`tasks.registry`: its table
in `warehouse.TABLES`, its ledger rows in `kimi-batch status`).

The registry is read when definitions are built, not when modules import: a stage declared
before `kimi_batch.definitions.build_definitions` runs is in the code location it builds.

`seed_prompts` (the landed inputs) is not a generation stage: stages read it as `SEED_ASSET`.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any

import dagster as dg
from pydantic import BaseModel, ConfigDict, Field, SkipValidation, field_validator

from kimi_batch.engine import SamplingParams
from kimi_batch.settings import Settings
from kimi_batch.tasks.amplify import DEFAULT_AMPLIFY_PARAMS, AmplifyTask, Strategy
from kimi_batch.tasks.distill import DistillTask
from kimi_batch.tasks.generation_task import GenerationTask
from kimi_batch.tasks.judge import DEFAULT_JUDGE_PARAMS, JudgeTask
from kimi_batch.tasks.registry import register_stage, unregister_stage
from kimi_batch.tasks.schemas import import_output_model

__all__ = [
    "AMPLIFY",
    "BATCH_GROUP",
    "DISTILL",
    "INGEST_TAG",
    "JUDGE",
    "OPTIONAL_TAG",
    "SEED_ASSET",
    "SEED_TABLES",
    "STAGE_DECLARATIONS",
    "AmplifyConfig",
    "DistillConfig",
    "JudgeConfig",
    "StageConfig",
    "StageDeclaration",
    "declare_stage",
    "nightly_stages",
    "upstream_of",
    "withdraw_stage",
]

Task = GenerationTask[Any, Any]
BATCH_GROUP = "batch"
SEED_ASSET = "seed_prompts"
SEED_TABLES = ("seeds", "quarantine")
# Asset tag of the stages the inbox sensor's ingest_job runs after landing the seeds.
INGEST_TAG = "kimi_batch/ingest"
# Asset tag of the stages a setting switches on (`switch`): batch_job leaves them out.
OPTIONAL_TAG = "kimi_batch/optional"


class StageConfig(dg.Config):
    """Run config of a stage's asset (shown in the launchpad); it builds the stage's task."""

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
    def key(self) -> dg.AssetKey:
        return dg.AssetKey(self.asset)

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
    register_stage(declaration.task)
    _DECLARATIONS[declaration.asset] = declaration
    return declaration


def withdraw_stage(asset: str) -> None:
    """Forget a declared stage and its task's registration (a test's own stage)."""
    if any(asset in d.reads for d in _DECLARATIONS.values()):
        raise ValueError(f"another stage reads {asset!r}")
    declaration = _DECLARATIONS.pop(asset, None)
    if declaration is not None:
        unregister_stage(declaration.task)


def nightly_stages(settings: Settings | None = None) -> list[StageDeclaration]:
    """The stages the nightly job runs, in declaration order: with `settings`, only those
    switched on (without, every stage it may run: its run config has a field for each)."""
    return [
        d for d in _DECLARATIONS.values() if d.nightly and (settings is None or d.enabled(settings))
    ]


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
            raise dg.Failure(str(error)) from error
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
            raise dg.Failure(f"judge rubric {settings.judge_rubric}: {error}") from error
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
