"""The nightly run: every partition the schedule asks for in one run, one engine batch a stage.

A run per partition left the server idle while each run's process started (about 7 s a run on
2 cores, `bench --workload night`). `nightly_job` is one op: it holds each partition's lease,
lands each partition's seeds (unless the day's ingest run landed them from the newest input
version already: they are kept), then sends the amplification requests of every partition as one
batch and their distillation requests as the next, so the slots stay full across partitions.
Each partition is still written on its own (its Parquet replaced, its quarantine, its checks,
its Trino partition) and recorded as its own materialization of `seed_prompts`,
`amplified_prompts` and `distilled_responses` with its own check evaluations, so the UI,
`status` and the next night see it as after a run of `distillation_job`. Trino publishing (and
its check) waits until after the last batch: the server would idle through each publish.

A partition that cannot go on (its input unreadable, its lease held by another run, a write
refused) is left out and named; past the nightly window the partitions whose rows are not all
done are left for the next night (their finished rows are in the ledger). Either way the run
fails at the end with the list, after every finished partition is written.
"""

# No `from __future__ import annotations`: Dagster reads the op function's annotations.

import types
from collections.abc import Iterable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import dagster as dg
from pydantic import Field, create_model

from kimi_batch.defs.assets._generation import (
    LLAMA_POOL,
    HeldPartition,
    generate,
    mark_stopped_at_window,
    partition_lease,
    publish,
    window_end,
)
from kimi_batch.defs.assets.batch import (
    SeedConfig,
    land_seed_partition,
    resolve_seeds_input,
    seeds_are_current,
)
from kimi_batch.defs.assets.stage import StagePlan, asked_again, land_stage, plan_stage
from kimi_batch.defs.jobs import (
    JOB_TAG,
    LLAMA_TAG,
    NIGHTLY_JOB_NAME,
    NIGHTLY_OP_NAME,
    SEED_PROMPTS,
)
from kimi_batch.defs.partitions import split_partition_key
from kimi_batch.defs.resources.digest import DigestResource
from kimi_batch.defs.resources.llama import LlamaServerResource
from kimi_batch.defs.resources.trino import TrinoResource
from kimi_batch.defs.resources.warehouse import WarehouseResource
from kimi_batch.defs.stages import nightly_stages
from kimi_batch.engine import LeaseLostError, Ledger
from kimi_batch.errors import KimiBatchError
from kimi_batch.tasks.stage import GenerationTask

__all__ = [
    "NightConfig",
    "build_nightly_job",
    "night_batch",
    "night_config_type",
    "nightly_job",
    "oldest_first",
]

_DATA_VERSION_TAG = "dagster/data_version"
_INPUT_SEEDS_VERSION_TAG = f"dagster/input_data_version/{SEED_PROMPTS.to_user_string()}"


class NightConfig(dg.Config):
    """The night's partitions (the schedule fills them in) and the seeds' config;
    `night_config_type()` adds a field per nightly stage with a run config (`night_field`)."""

    partitions: list[str] = Field(description="'date|source' partition keys, oldest first.")
    skip_stages: list[str] = Field(
        default_factory=list,
        description="Nightly stages (asset names) not run this night: the stages after them "
        "read the rows they landed already.",
    )
    seeds: SeedConfig = Field(default_factory=SeedConfig)


def night_config_type() -> type[NightConfig]:
    """`NightConfig` with each declared nightly stage's run config as a field, as declared now."""
    fields: dict[str, Any] = {
        d.config_field: (d.config, Field(default_factory=d.config))
        for d in nightly_stages()
        if d.config is not None
    }
    return create_model("NightConfig", __base__=NightConfig, __doc__=NightConfig.__doc__, **fields)


@dataclass
class _Night:
    """The partitions still going on, and why the others stopped."""

    leases: dict[str, HeldPartition] = field(default_factory=dict)  # every lease this run holds
    going: dict[str, HeldPartition] = field(default_factory=dict)  # partitions still going on
    failed: dict[str, str] = field(default_factory=dict)
    stopped: list[str] = field(default_factory=list)
    # (asset, partition key, tables) landed but not yet published to Trino.
    unpublished: list[tuple[dg.AssetKey, str, list[str]]] = field(default_factory=list)

    def hold(self, key: str, lease: HeldPartition) -> None:
        self.leases[key] = self.going[key] = lease

    def drop(self, key: str, reason: str) -> None:
        self.going.pop(key, None)
        if key in self.stopped:  # its landed tables could not be published after all
            self.stopped.remove(key)
        self.failed[key] = reason

    def summary(self, total: int) -> str:
        lines = [f"{total - len(self.failed) - len(self.stopped)} of {total} partitions done"]
        if self.stopped:
            lines.append(
                f"the nightly window ended: {len(self.stopped)} partition(s) resume next night "
                f"({', '.join(self.stopped[:10])})"
            )
        lines += [f"{key}: {reason}" for key, reason in list(self.failed.items())[:20]]
        return "; ".join(lines)


def _record(
    context: dg.OpExecutionContext,
    asset: dg.AssetKey,
    key: str,
    result: dg.MaterializeResult,
    *,
    consumed_seeds: str = "",
    checks_only: bool = False,
) -> None:
    """The partition's materialization and check evaluations, as its own asset run logs them:
    its data version, and the seeds' data version it consumed (lineage and staleness in the UI
    read these tags; an asset step's provenance records the same)."""
    if not checks_only:
        tags: dict[str, str] = {}
        if result.data_version:
            tags[_DATA_VERSION_TAG] = result.data_version.value
        if consumed_seeds:
            tags[_INPUT_SEEDS_VERSION_TAG] = consumed_seeds
        context.log_event(
            dg.AssetMaterialization(
                asset, partition=key, metadata=result.metadata, tags=tags or None
            )
        )
    for check in result.check_results or ():
        # Dagster's docs log an op's check evaluations this way; its `UserEvent` hint omits them.
        context.log_event(
            dg.AssetCheckEvaluation(  # pyright: ignore[reportArgumentType]
                asset_key=asset,
                check_name=check.check_name or "",
                passed=check.passed,
                metadata=check.metadata,
                severity=check.severity,
                partition=key,
            )
        )


_SKIPPED = (dg.Failure, LeaseLostError, KimiBatchError)


def _reason(error: BaseException) -> str:
    return error.description if isinstance(error, dg.Failure) and error.description else str(error)


@dataclass(frozen=True)
class _Resources:
    llama: LlamaServerResource
    digest: DigestResource
    warehouse: WarehouseResource
    trino: TrinoResource


def _parts(key: str) -> tuple[str, str]:
    """(ds, source) of a key the op has already checked (`night_batch` holds only those)."""
    parts = split_partition_key(key)
    if parts is None:
        raise ValueError(f"not a date|source partition key: {key!r}")
    return parts


def _land_seeds(
    context: dg.OpExecutionContext, config: NightConfig, night: _Night, resources: _Resources
) -> None:
    settings = resources.llama.settings()
    for key, held in list(night.going.items()):
        try:
            resolved = resolve_seeds_input(settings, *_parts(key))
            if seeds_are_current(resources.warehouse, resolved):
                continue  # the day's ingest run landed this version: kept as it is
            result = land_seed_partition(
                context,
                config.seeds,
                held,
                resolved,
                llama=resources.llama,
                digest=resources.digest,
                warehouse=resources.warehouse,
                trino=resources.trino,
                publish_now=False,
            )
        except _SKIPPED as error:
            night.drop(key, _reason(error))
            continue
        _record(context, SEED_PROMPTS, key, result)
        night.unpublished.append((SEED_PROMPTS, key, ["seeds", "quarantine"]))


def oldest_first(keys: Iterable[str]) -> dict[str, int]:
    """Each checked `date|source` key's rank (0 = the oldest day), whatever order the run's
    config lists them in; a request several partitions share goes out at the lowest."""
    return {key: rank for rank, key in enumerate(sorted(keys, key=_parts))}


def _run_stage(
    context: dg.OpExecutionContext,
    asset: dg.AssetKey,
    task: GenerationTask[Any, Any],
    night: _Night,
    ledger: Ledger,
    resources: _Resources,
) -> None:
    """One batch of `task` over every partition still going on, then each one written."""
    store = resources.warehouse.warehouse()
    plans: dict[str, StagePlan] = {}
    for key in list(night.going):
        try:
            plans[key] = plan_stage(task, store, *_parts(key))
        except _SKIPPED as error:
            night.drop(key, _reason(error))
    # Oldest partition first: past the window the partitions left are the newest, whole.
    ranks = oldest_first(plans)
    requests = [
        request.model_copy(update={"priority": ranks[key]})
        for key, plan in plans.items()
        for request in plan.requests
    ]
    label = f"{asset.to_user_string()} ({len(plans)} partitions)"
    llama, digest = resources.llama, resources.digest
    outcome = generate(context, llama, digest, ledger, requests, label=label)
    start = 0
    for key, plan in plans.items():
        share = outcome.share(slice(start, start + len(plan.requests)), ledger)
        start += len(plan.requests)
        if share.stopped_at_window:
            night.going.pop(key, None)
            night.stopped.append(key)
            continue
        results = share.iter_results(ledger)
        if task.asks_again:
            results = asked_again(
                context,
                ledger,
                plan,
                share,
                rerun=lambda again: generate(context, llama, digest, ledger, again, label=label),
            )
        try:
            result = land_stage(
                context,
                plan,
                night.going[key],
                share,
                results,
                store=store,
                trino=resources.trino,
                publish_now=False,
            )
        except _SKIPPED as error:
            night.drop(key, _reason(error))
            continue
        _record(context, asset, key, result, consumed_seeds=plan.input_sha)
        night.unpublished.append((asset, key, [task.table, "quarantine"]))


def _publish_all(context: dg.OpExecutionContext, night: _Night, resources: _Resources) -> None:
    """Publish every landed partition to Trino after the last batch (the server would idle
    through each publish between two batches), and record each one's check."""
    store = resources.warehouse.warehouse()
    for asset, key, tables in night.unpublished:
        try:
            check = publish(
                context, resources.trino, store, tables, *_parts(key), night.leases[key].check
            )
        except LeaseLostError as error:
            night.drop(key, _reason(error))
            continue
        _record(context, asset, key, dg.MaterializeResult(check_results=[check]), checks_only=True)


def night_batch(
    context: dg.OpExecutionContext,
    config: NightConfig,
    llama: LlamaServerResource,
    digest: DigestResource,
    warehouse: WarehouseResource,
    trino: TrinoResource,
) -> None:
    """Seeds, amplification and distillation of every partition of the night, one batch a
    stage; each partition written, materialized and checked on its own."""
    resources = _Resources(llama=llama, digest=digest, warehouse=warehouse, trino=trino)
    settings = llama.settings()
    night = _Night()
    stages: list[tuple[dg.AssetKey, GenerationTask[Any, Any]]] = [
        (d.key, d.build(getattr(config, d.config_field, None), settings))
        for d in nightly_stages()
        if d.asset not in config.skip_stages
    ]
    with ExitStack() as stack:
        for key in config.partitions:
            parts = split_partition_key(key)
            if parts is None:
                night.failed[key] = "not a date|source partition key"
                continue
            try:
                night.hold(key, stack.enter_context(partition_lease(context, warehouse, *parts)))
            except dg.Failure as error:
                night.failed[key] = _reason(error)
        _land_seeds(context, config, night, resources)
        ledger = stack.enter_context(warehouse.ledger())
        for asset, task in stages:
            if night.going:
                _run_stage(context, asset, task, night, ledger, resources)
        _publish_all(context, night, resources)
    if night.stopped:
        mark_stopped_at_window(context)
    if night.failed or night.stopped:
        raise dg.Failure(
            night.summary(len(config.partitions)),
            metadata={
                "partitions": len(config.partitions),
                "failed": len(night.failed),
                "stopped_at_window": len(night.stopped),
                "window_ends": str(window_end(context)),
            },
        )


def build_nightly_job() -> dg.JobDefinition:
    """The nightly job over the stages declared now (`kimi_batch.defs.stages`)."""

    # `night_batch` itself, with its own annotations: Dagster takes the run-config schema from
    # the `config` annotation, here with a field per declared nightly stage.
    op = types.FunctionType(night_batch.__code__, night_batch.__globals__, NIGHTLY_OP_NAME)
    op.__annotations__ = {**night_batch.__annotations__, "config": night_config_type()}
    op.__doc__ = night_batch.__doc__
    night_op = dg.op(name=NIGHTLY_OP_NAME, pool=LLAMA_POOL)(op)

    @dg.job(
        name=NIGHTLY_JOB_NAME,
        description="The nightly distillation: every partition the schedule asks for in one run.",
        tags={JOB_TAG: "nightly", LLAMA_TAG: "true"},
        executor_def=dg.in_process_executor,
    )
    def nightly_job() -> None:
        night_op()

    return nightly_job


nightly_job = build_nightly_job()


@dg.definitions
def defs() -> dg.Definitions:
    """The nightly job of this code location, over the stages declared when it loads."""
    return dg.Definitions(jobs=[build_nightly_job()])
