"""A partition's seeds landed from its input, no Dagster: the input resolved (its inbox file
landed now, else its newest snapshot), the `seeds` rows and the input quarantine written with
prompts over the server's per-slot limit set aside, and whether both were written from the
newest version already (`seeds_consumed`: the day's ingest run did it, the night keeps them).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from kimi_batch.engine import InterruptibleRunner, LlamaDeployment, SystemDigest
from kimi_batch.inputs import InputReader, Landing, ResolvedInput, land_input, resolve_partition
from kimi_batch.pipeline.driver import HeldPartition, PartitionSkippedError, consumed_input_sha
from kimi_batch.pipeline.prompt_length import check_prompt_lengths
from kimi_batch.pipeline.rows import file_row
from kimi_batch.settings import Settings
from kimi_batch.storage import StorageError
from kimi_batch.warehouse import PartitionWrite, Warehouse


@dataclass(frozen=True)
class SeedsWritten:
    """A seeds partition written: the write, the input's rows set aside for the file itself,
    and the prompt limit its rows were checked against (tokens, the answer budget left out)."""

    written: PartitionWrite
    quarantined: int
    limit: int


def resolve_seeds_input(settings: Settings, ds: str, source: str) -> ResolvedInput:
    """The partition's input to land (its inbox file landed now, else its newest snapshot)."""
    try:
        return resolve_partition(settings, ds, source)
    except StorageError as error:
        raise PartitionSkippedError(str(error)) from error


def seeds_consumed(landing: Landing, store: Warehouse, resolved: ResolvedInput) -> bool:
    """The partition's `seeds` and input quarantine were landed from `resolved`'s version
    already, with nothing about the file to set aside."""
    version, item = resolved.version, resolved.assignment
    if version is None or resolved.problem:
        return False
    # Both writes finished: seeds at this version alone may be a run killed before the
    # quarantine's write (issue 42 item 4), whose rejected lines only a landing writes.
    if landing.consumed(item.ds, item.source) != version.sha256:
        return False
    return consumed_input_sha(store, item.ds, item.source) == version.sha256


def write_seeds(
    runner: InterruptibleRunner,
    stores: tuple[Warehouse, Landing],
    resolved: ResolvedInput,
    *,
    server: LlamaDeployment,
    digest: SystemDigest,
    answer_budget_tokens: int,
    held: HeldPartition,
    now: datetime,
) -> SeedsWritten:
    """Write the `seeds` partition and the input quarantine (`land_input`), quarantining prompts
    over the server's per-slot limit and the file itself when it has a problem."""
    settings, version = server.settings, resolved.version
    name = resolved.assignment.name
    set_aside = (
        [file_row(source_file=name, reason=resolved.problem, created_at=now)]
        if resolved.problem
        else []
    )
    client = server.client()
    try:
        prepared = runner.run(server.prepare(digest))
        first = prepared.endpoints[0]
        limit = (first.ctx or settings.llama_ctx // first.slots) - answer_budget_tokens
        written = land_input(
            *stores,
            resolved.assignment.ds,
            resolved.assignment.source,
            snapshot=version.path if version else None,
            reader=InputReader(source_name=name, now=now, max_input_bytes=settings.max_input_bytes),
            input_sha256=version.sha256 if version else "",
            check_lengths=lambda seeds: runner.run(
                check_prompt_lengths(
                    seeds, client, digest_tokens=prepared.digest_tokens, limit=limit, now=now
                )
            ),
            now=now,
            set_aside=set_aside,
            guard=held.lease,
        )
    finally:
        runner.run(client.aclose())
    return SeedsWritten(written=written, quarantined=len(set_aside), limit=limit)


def seed_figures(seeds: SeedsWritten, resolved: ResolvedInput) -> dict[str, int | str]:
    """What a seeds partition's record says: counts, its input, where it was read from."""
    sha = resolved.version.sha256 if resolved.version else None
    return {
        "rows": seeds.written.rows,
        "quarantined": seeds.quarantined,
        "source_file": resolved.assignment.name,
        "input_sha256": sha or "none",
        "read_from": "inbox" if resolved.from_inbox else "landed snapshot",
        "prompt_token_limit": seeds.limit,
    }
