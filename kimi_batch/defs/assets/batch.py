"""Partitioned batch assets: seeds landed from the inbox, amplified variants, teacher answers.

Their partitions depend on the deployment (`kimi_batch.defs.partitions`), so the assets are made
by `build_batch_assets(partitions)`; `defs` builds them for the code location from the one
`Settings` (`kimi_batch.defs.deployment`).
"""

from datetime import UTC, datetime

import dagster as dg
from pydantic import Field

from kimi_batch.defs.assets._generation import (
    BATCH_GROUP,
    LLAMA_POOL,
    HeldPartition,
    RunContext,
    check_specs,
    partition_lease,
    publish,
)
from kimi_batch.defs.assets.landing import consumed_input_sha
from kimi_batch.defs.assets.stage import StageConfig, generation_asset
from kimi_batch.defs.deployment import deployment_settings
from kimi_batch.defs.interrupts import interruptible_runner
from kimi_batch.defs.partitions import build_batch_partitions, partition_parts
from kimi_batch.defs.resources.digest import DigestResource
from kimi_batch.defs.resources.llama import LlamaServerResource
from kimi_batch.defs.resources.trino import TrinoResource
from kimi_batch.defs.resources.warehouse import WarehouseResource
from kimi_batch.engine import SamplingParams
from kimi_batch.settings import Settings
from kimi_batch.storage import (
    ResolvedInput,
    StorageError,
    land_seeds,
    replace_quarantine,
    resolve_partition,
)
from kimi_batch.tasks.amplify import DEFAULT_AMPLIFY_PARAMS, AmplifyTask, Strategy
from kimi_batch.tasks.distill import DistillTask
from kimi_batch.tasks.prompt_length import check_prompt_lengths
from kimi_batch.tasks.quarantine import INPUT_STAGE, file_row
from kimi_batch.tasks.reader import InputReader
from kimi_batch.tasks.schemas import import_output_model

__all__ = [
    "AmplifyConfig",
    "DistillConfig",
    "build_batch_assets",
    "defs",
    "land_seed_partition",
    "resolve_seeds_input",
    "seed_prompts",
    "seeds_are_current",
]


AMPLIFY_MAX_TOKENS = DEFAULT_AMPLIFY_PARAMS.max_tokens


class SeedConfig(dg.Config):
    answer_budget_tokens: int = Field(
        default=256, gt=0, description="Context kept free for the answer when checking length."
    )


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


def resolve_seeds_input(settings: Settings, ds: str, source: str) -> ResolvedInput:
    """The partition's input to land (its inbox file landed now, else its newest snapshot)."""
    try:
        return resolve_partition(settings, ds, source)
    except StorageError as error:
        raise dg.Failure(str(error)) from error


def seeds_are_current(warehouse: WarehouseResource, resolved: ResolvedInput) -> bool:
    """The partition's `seeds` were landed from `resolved`'s version already (the day's ingest
    run did it), with nothing about the file to set aside."""
    version, item = resolved.version, resolved.assignment
    return (
        version is not None
        and not resolved.problem
        and consumed_input_sha(warehouse.warehouse(), item.ds, item.source) == version.sha256
    )


def seed_prompts(
    context: dg.AssetExecutionContext,
    config: SeedConfig,
    llama: LlamaServerResource,
    digest: DigestResource,
    warehouse: WarehouseResource,
    trino: TrinoResource,
) -> dg.MaterializeResult:
    """Validated input rows of one landed inbox file (table `seeds`); bad rows go to quarantine."""
    ds, source = partition_parts(context)
    with partition_lease(context, warehouse, ds, source) as held:
        return land_seed_partition(
            context,
            config,
            held,
            resolve_seeds_input(llama.settings(), ds, source),
            llama=llama,
            digest=digest,
            warehouse=warehouse,
            trino=trino,
        )


def land_seed_partition(
    context: RunContext,
    config: SeedConfig,
    held: HeldPartition,
    resolved: ResolvedInput,
    *,
    llama: LlamaServerResource,
    digest: DigestResource,
    warehouse: WarehouseResource,
    trino: TrinoResource,
    publish_now: bool = True,
) -> dg.MaterializeResult:
    """Land the partition's `resolved` input as its `seeds` rows (the run holds the partition's
    lease); `publish_now=False` leaves the Trino publish and its check to the caller."""
    settings = llama.settings()
    ds, source = resolved.assignment.ds, resolved.assignment.source
    if resolved.deferred:
        context.log.warning(f"{resolved.deferred}; this run reads the last landed version")
    name, version, now = resolved.assignment.name, resolved.version, datetime.now(UTC)
    set_aside = (
        [file_row(source_file=name, reason=resolved.problem, created_at=now)]
        if (resolved.problem)
        else []
    )
    store = warehouse.warehouse()
    with interruptible_runner() as runner:
        client = llama.client()
        try:
            prepared = runner.run(llama.prepare(digest.load()))
            first = prepared.endpoints[0]
            limit = (first.ctx or settings.llama_ctx // first.slots) - config.answer_budget_tokens
            written = land_seeds(
                store,
                ds,
                source,
                snapshot=version.path if version else None,
                reader=InputReader(
                    source_name=name, now=now, max_input_bytes=settings.max_input_bytes
                ),
                input_sha256=version.sha256 if version else "",
                check_lengths=lambda seeds: runner.run(
                    check_prompt_lengths(
                        seeds, client, digest_tokens=prepared.digest_tokens, limit=limit, now=now
                    )
                ),
                now=now,
                set_aside=set_aside,
                guard=held.check,
            )
        finally:
            runner.run(client.aclose())
        sha = version.sha256 if version else None
        stamped = [row.model_copy(update={"input_sha256": sha}) for row in set_aside]
        replace_quarantine(store, ds, source, INPUT_STAGE, stamped, guard=held.check)
        published = (
            [publish(context, trino, store, ["seeds", "quarantine"], ds, source, held.check)]
            if publish_now
            else []
        )
    return dg.MaterializeResult(
        # The landed version is the data version: downstream partitions built from another one
        # are shown stale (Dagster's provenance), and `status`/the nightly read the full sha.
        data_version=dg.DataVersion(sha) if sha else None,
        metadata={
            "rows": written.rows,
            "quarantined": len(set_aside),
            "source_file": name,
            "input_sha256": dg.MetadataValue.text(sha or "none"),
            "read_from": "inbox" if resolved.from_inbox else "landed snapshot",
            "prompt_token_limit": limit,
            "path": dg.MetadataValue.path(str(written.path)),
        },
        check_results=published,
    )


def build_batch_assets(partitions: dg.PartitionsDefinition) -> list[dg.AssetsDefinition]:
    """seed_prompts → amplified_prompts → distilled_responses over `partitions`."""
    seeds = dg.asset(
        partitions_def=partitions,
        group_name=BATCH_GROUP,
        # `llama.prepare()` may start the server and asks it to tokenize: a llama step too.
        pool=LLAMA_POOL,
        kinds={"parquet", "trino"},
        check_specs=check_specs("seed_prompts", partitions, ["published_to_trino"]),
    )(seed_prompts)
    amplified = generation_asset(
        name="amplified_prompts",
        task=AmplifyConfig,
        partitions=partitions,
        deps=[seeds],
        description="New training prompts: k paraphrased, harder and related variants per seed, "
        "deduplicated.",
    )
    distilled = generation_asset(
        name="distilled_responses",
        task=DistillConfig,
        partitions=partitions,
        deps=[seeds, amplified],
        description="Teacher answers for every seed and variant, with token counts, cache hits "
        "and timings.",
    )
    return [seeds, amplified, distilled]


@dg.definitions
def defs() -> dg.Definitions:
    """The batch assets over the deployment's (date, source) partitions."""
    return dg.Definitions(assets=build_batch_assets(build_batch_partitions(deployment_settings())))
