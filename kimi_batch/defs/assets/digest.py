"""The fixed system digest and its one-time prefill into every slot of the resident server."""

import dagster as dg

from kimi_batch.defs.assets.stage_asset import ASSET_OWNERS, LLAMA_POOL, run_interruptibly
from kimi_batch.defs.resources import DigestResource, LlamaServerResource
from kimi_batch.engine import ContextTooSmallError, DigestLintError, SystemDigest, warm_digest

DIGEST_GROUP = "digest"


def _load(digest: DigestResource) -> SystemDigest:
    try:
        return digest.load()
    except DigestLintError as error:
        raise dg.Failure(
            str(error), metadata={"findings": [str(f) for f in error.findings]}
        ) from error


# `llama.server().prepare()` may start the server and tokenizes the digest there: in the llama pool.
@dg.asset(
    group_name=DIGEST_GROUP,
    pool=LLAMA_POOL,
    kinds={"llamacpp"},
    owners=ASSET_OWNERS,
    tags={"layer": "prompt"},
)
def system_digest(digest: DigestResource, llama: LlamaServerResource) -> dg.MaterializeResult:
    """The byte-stable system prompt every request starts with, fingerprinted and linted."""
    loaded = _load(digest)
    tokens = run_interruptibly(llama.server().prepare(loaded)).digest_tokens
    return dg.MaterializeResult(
        metadata={
            "sha256": loaded.sha256,
            "tokens": tokens,
            "bytes": loaded.n_bytes,
            "path": dg.MetadataValue.path(loaded.path),
        },
        data_version=dg.DataVersion(loaded.sha256),
    )


@dg.asset(
    group_name=DIGEST_GROUP,
    deps=[system_digest],
    pool=LLAMA_POOL,
    kinds={"llamacpp"},
    owners=ASSET_OWNERS,
    check_specs=[dg.AssetCheckSpec("every_slot_holds_digest", asset="digest_prefill")],
)
def digest_prefill(
    context: dg.AssetExecutionContext, digest: DigestResource, llama: LlamaServerResource
) -> dg.MaterializeResult:
    """The digest in the KV cache of every slot: one prefill, saved, restored everywhere else."""
    loaded = _load(digest)
    try:
        tokens, reports = run_interruptibly(warm_digest(llama.server(), loaded))
    except ContextTooSmallError as error:
        raise dg.Failure(str(error)) from error
    canaries = [c for report in reports for c in report.canaries]
    cold = [f"{r.endpoint} slot {c.slot_id}" for r in reports for c in r.canaries if not c.warm]
    prefill_ms = sum(r.prefill_ms for r in reports)
    restored = sum(len(r.restored_slots) for r in reports)
    for report in reports:
        context.log.info(
            f"{report.endpoint}: prefilled {report.prefilled_slots}, restored "
            f"{report.restored_slots} from {report.save_name}"
        )
    return dg.MaterializeResult(
        metadata={
            "digest_sha256": loaded.sha256,
            "digest_tokens": tokens,
            "slots": sum(r.slots for r in reports),
            "prefills": sum(len(r.prefilled_slots) for r in reports),
            "restores": restored,
            "prefill_ms": prefill_ms,
            "restore_ms": sum(r.restore_ms for r in reports),
            "restore_ms_per_slot": sum(r.restore_ms for r in reports) / restored
            if restored
            else 0.0,
            "save_ms": sum(r.save_ms for r in reports),
            "prefill_tokens_per_s": tokens / (prefill_ms / 1000) if prefill_ms else 0.0,
            "slots_verified": sum(1 for c in canaries if c.warm),
            "min_cached_tokens": min((c.cached_tokens for c in canaries), default=0),
        },
        check_results=[
            dg.AssetCheckResult(
                check_name="every_slot_holds_digest",
                passed=not cold,
                metadata={"cold_slots": ", ".join(cold) or "none", "digest_tokens": tokens},
            )
        ],
        data_version=dg.DataVersion(loaded.sha256),
    )
