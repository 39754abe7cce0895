"""Keeping every slot warm with the digest: one prefill, then slot save/restore.

A request pinned to a slot without the digest prefills it in full (measured: the RAM prompt cache
does not help an empty slot), which on the target costs ~44 minutes. So the digest is prefilled
into one slot, saved with the slot API, and restored into every other slot (milliseconds); after a
server restart it is restored from the saved file and never prefilled again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.engine.digest import SystemDigest
from kimi_batch.engine.prompt import warmup_messages
from kimi_batch.llama import GenerationStats, LlamaClient, LlamaError, LlamaHTTPError

logger = logging.getLogger(__name__)

IDLE_WAIT_S = 600.0


def digest_save_name(
    digest_sha256: str, model: str, ctx: int | None, *, kind: str = "digest"
) -> str:
    """Slot-save file name: a new digest, model or context never restores a stale cache. `kind`
    keeps a batch's own saves ("prompt") apart from the pipeline digest's, which stays."""
    safe_model = re.sub(r"[^A-Za-z0-9_.-]", "_", model)[:64]
    return f"{kind}-{digest_sha256[:16]}-{safe_model}-ctx{ctx or 0}.bin"


class CanaryResult(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    slot_id: int
    cached_tokens: int
    evaluated_tokens: int
    digest_tokens: int

    @property
    def warm(self) -> bool:
        return self.cached_tokens >= self.digest_tokens


class WarmupReport(BaseModel):
    """How the slots of one endpoint got the digest."""

    model_config = ConfigDict(extra="forbid")

    endpoint: str
    digest_sha256: str
    digest_tokens: int
    slots: int
    save_name: str
    prefilled_slots: list[int] = Field(default_factory=list)
    restored_slots: list[int] = Field(default_factory=list)
    prefill_ms: float = 0.0
    save_ms: float = 0.0
    restore_ms: float = Field(default=0.0, description="All restores together.")
    canaries: list[CanaryResult] = Field(default_factory=list)

    @property
    def slots_verified(self) -> int:
        return sum(1 for canary in self.canaries if canary.warm)

    @property
    def restore_ms_per_slot(self) -> float:
        return self.restore_ms / len(self.restored_slots) if self.restored_slots else 0.0


class SlotWarmer:
    """Put the digest into the KV cache of the slots of one endpoint."""

    def __init__(
        self,
        client: LlamaClient,
        digest: SystemDigest,
        *,
        digest_tokens: int,
        model: str,
        ctx: int | None,
        prefill_timeout_s: float | None = None,
        save_name: str | None = None,
        save_dir: Path | None = None,
    ) -> None:
        self.client = client
        self.digest = digest
        self.digest_tokens = digest_tokens
        self.save_name = save_name or digest_save_name(digest.sha256, model, ctx)
        # The digest's prefill at the measured speed, with margin (the caller's deadline): a
        # frozen server ends the call, it does not hold it for the client's hour.
        self.prefill_timeout_s = prefill_timeout_s
        # The server's --slot-save-path as this process sees it (a resident server's): a restore
        # whose file is not there is not asked for. ik_llama.cpp's server never answers one (its
        # error result does not reach the waiting request), which would cost a timeout per slot.
        self.save_dir = save_dir

    async def _generate_on(self, slot_id: int) -> GenerationStats:
        completion = await self.client.chat(
            warmup_messages(self.digest),
            max_tokens=1,
            temperature=0.0,
            slot_id=slot_id,
            timeout_s=self.prefill_timeout_s,
        )
        return completion.stats

    async def prefill(self, slot_id: int) -> float:
        """Full prefill of the digest into one slot; returns milliseconds."""
        started = time.perf_counter()
        await self._generate_on(slot_id)
        return (time.perf_counter() - started) * 1000

    async def wait_idle(self, slot_id: int, timeout_s: float = IDLE_WAIT_S) -> None:
        """Wait until a slot finishes what it is doing (a killed run's request, say).

        A restore into a busy slot fails, and falling back to a prefill would cost the full
        digest; the request in progress finishes in seconds to minutes.
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                slots = await self.client.slots()
            except LlamaError:
                return  # no /slots on this build: restore and see
            if not any(slot.id == slot_id and slot.is_processing for slot in slots):
                return
            await asyncio.sleep(0.2)

    async def restore(self, slot_id: int) -> float | None:
        """Restore the saved digest into a slot; None when no save file exists (or no slot API)."""
        if self.save_dir is not None and not (self.save_dir / self.save_name).is_file():
            return None
        await self.wait_idle(slot_id)
        started = time.perf_counter()
        try:
            await self.client.restore_slot(slot_id, self.save_name)
        except LlamaHTTPError as error:
            logger.info("no digest restore for slot %d: %s", slot_id, error.message)
            return None
        return (time.perf_counter() - started) * 1000

    async def canary(self, slot_id: int) -> CanaryResult:
        stats = await self._generate_on(slot_id)
        return CanaryResult(
            slot_id=slot_id,
            cached_tokens=stats.cached_tokens,
            evaluated_tokens=stats.evaluated_tokens,
            digest_tokens=self.digest_tokens,
        )

    async def warm_all(self, slots: int, *, verify: bool = True) -> WarmupReport:
        """One prefill (or none, when a save exists), S-1 restores, one canary per slot."""
        report = WarmupReport(
            endpoint=self.client.base_url,
            digest_sha256=self.digest.sha256,
            digest_tokens=self.digest_tokens,
            slots=slots,
            save_name=self.save_name,
        )
        restored = await self.restore(0)
        if restored is None:
            report.prefill_ms = await self.prefill(0)
            report.prefilled_slots.append(0)
            started = time.perf_counter()
            try:
                await self.client.save_slot(0, self.save_name)
                report.save_ms = (time.perf_counter() - started) * 1000
            except LlamaHTTPError as error:
                # No --slot-save-path on this server: every slot pays its own prefill.
                logger.warning("slot save unavailable (%s): prefilling every slot", error.message)
        else:
            report.restore_ms += restored
            report.restored_slots.append(0)
        for slot_id in range(1, slots):
            restored = await self.restore(slot_id)
            if restored is None:
                report.prefill_ms += await self.prefill(slot_id)
                report.prefilled_slots.append(slot_id)
            else:
                report.restore_ms += restored
                report.restored_slots.append(slot_id)
        if verify:
            report.canaries = [await self.canary(slot_id) for slot_id in range(slots)]
        return report

    async def rewarm(self, slot_id: int) -> bool:
        """Make a cold slot warm again; True when a full prefill was needed."""
        if await self.restore(slot_id) is not None:
            return False
        await self.prefill(slot_id)
        with contextlib.suppress(LlamaHTTPError):  # no slot-save path: still warm, just unsaved
            await self.client.save_slot(slot_id, self.save_name)
        return True
