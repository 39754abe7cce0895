"""The code location: every definition in the defs folder, built from one `Settings` per process.

`defs` is what workspace.yaml, `dg` and `dagster -m kimi_batch.definitions` load: it reads the
environment once (`Settings.from_env`) and hands that `Settings` to `build_definitions`, which
loads `kimi_batch/defs/` with `dg.load_from_defs_folder` (so a file added with `dg scaffold defs`
loads) and binds the resources. Importing this module reads no variable and writes no file: the
work happens when Dagster calls `defs`. Tests, the demo and the bench call `build_definitions`,
`build_resources` and `batch_assets` with a `Settings` of their own.
"""

from __future__ import annotations

import logging
from pathlib import Path

import dagster as dg

from kimi_batch.defs.assets.batch import build_batch_assets
from kimi_batch.defs.assets.digest import digest_prefill, system_digest
from kimi_batch.defs.deployment import building
from kimi_batch.defs.partitions import build_batch_partitions
from kimi_batch.defs.resources import (
    DigestResource,
    LlamaServerResource,
    TrinoResource,
    WarehouseResource,
)
from kimi_batch.llama import CpuListError, format_cpu_list, parse_cpu_list, pin_to_the_rest
from kimi_batch.settings import Settings

DIGEST_ASSETS = [system_digest, digest_prefill]


def batch_assets(settings: Settings) -> list[dg.AssetsDefinition]:
    """seed_prompts and the stages `settings` switch on (amplify, distill; the judge when
    KIMI_BATCH_JUDGE_NIGHTLY=on) over the deployment's partitions."""
    return build_batch_assets(build_batch_partitions(settings), settings)


def build_resources(settings: Settings) -> dict[str, dg.ConfigurableResource]:
    """The resources, each holding `settings` as a dependency run config cannot replace."""
    return {
        "llama": LlamaServerResource(deployment=settings),
        "digest": DigestResource(deployment=settings),
        "warehouse": WarehouseResource(deployment=settings),
        "trino": TrinoResource(deployment=settings),
    }


def build_definitions(settings: Settings) -> dg.Definitions:
    """Everything in the defs folder, for the deployment `settings`, with its resources."""
    with building(settings):
        folder = dg.load_from_defs_folder(path_within_project=Path(__file__).parent)
    # Every job's steps run in its run's own process (the jobs' default; a job may still name
    # another executor). Steps of one run go one after another anyway (each holds the llama
    # pool's one slot or waits on the step before it), so a process per step bought no
    # parallelism: it cost a process start loading this location (~5-8 s on 2 cores) between
    # every two steps, with the server idle (`bench --workload night`).
    return dg.Definitions.merge(
        folder,
        dg.Definitions(resources=build_resources(settings), executor=dg.in_process_executor),
    )


def keep_off_the_server_cpus(settings: Settings) -> frozenset[int] | None:
    """With `KIMI_BATCH_LLAMA_CPUS` set, move this process (a code server or a run worker, and
    what it starts) to the CPUs the server does not hold; the set it keeps, or None.

    A process started on the other CPUs already (`taskset`, a pinned parent) stays there: the
    server's CPUs need not be among its own, as `server start` checks they are."""
    if not settings.llama_cpus:
        return None
    try:
        cpus = parse_cpu_list(settings.llama_cpus)
    except CpuListError as error:  # `server start` reports it; loading goes on unpinned
        logging.getLogger(__name__).warning("not pinned: KIMI_BATCH_LLAMA_CPUS: %s", error)
        return None
    rest = pin_to_the_rest(cpus)
    logging.getLogger(__name__).info("pinned to CPUs %s", format_cpu_list(rest))
    return rest


@dg.definitions
def defs() -> dg.Definitions:
    """The kimi_batch code location, configured by this process's `KIMI_BATCH_*` variables."""
    settings = Settings.from_env()
    keep_off_the_server_cpus(settings)
    return build_definitions(settings)
