"""Bringing an endpoint and a slot back: between the attempts of a request, and when the
watchdog finds an endpoint hung (restart it, send what it held again)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from kimi_batch.engine.outcome import EnginePolicy
from kimi_batch.engine.send import EndpointHungError
from kimi_batch.engine.warm import SlotWarmer
from kimi_batch.engine.watchdog import EndpointWatch
from kimi_batch.llama import (
    LlamaClient,
    LlamaConnectionError,
    LlamaError,
    LlamaLoadingError,
    LlamaTimeoutError,
)

logger = logging.getLogger(__name__)


class Recovery:
    """Recovers the endpoints of one run; counts the digest re-prefills its re-warming costs."""

    def __init__(
        self,
        watches: dict[LlamaClient, EndpointWatch],
        policy: EnginePolicy,
        *,
        on_unreachable: Callable[[str], None] | None,
        on_hung: Callable[[str], None] | None,
    ) -> None:
        self.watches = watches
        self.policy = policy
        self.on_unreachable = on_unreachable
        self.on_hung = on_hung
        self.reprefills = 0

    async def before_warmup(self, client: LlamaClient, error: LlamaError, attempt: int) -> None:
        """Bring the endpoint back before warming it again. A warm-up call that ran out of time
        met a server that accepts connections and does not answer: restart it as hung (waiting
        for its health would wait on the frozen server itself)."""
        if isinstance(error, LlamaTimeoutError):
            await self._restart_if_silent(self.watches[client])
            return
        if isinstance(error, LlamaConnectionError) and self.on_unreachable is not None:
            await asyncio.to_thread(self.on_unreachable, client.base_url)
        with contextlib.suppress(LlamaError):
            await client.wait_until_healthy(self.policy.load_wait_s)
        await asyncio.sleep(self.policy.delay(attempt))

    async def before_retry(
        self,
        warmer: SlotWarmer,
        slot_id: int,
        error: LlamaError,
        attempt: int,
        *,
        rewarm: bool = True,
    ) -> None:
        """Bring the endpoint and the slot back before the next attempt; the slot gets the
        engine's digest again unless the request has its own (`rewarm=False`: the next
        attempt brings that one in)."""
        client = warmer.client
        if isinstance(error, EndpointHungError):
            # The watchdog restarts the server once for every request it held.
            await self.watches[client].ready.wait()
        elif isinstance(error, LlamaConnectionError | LlamaLoadingError):
            if isinstance(error, LlamaConnectionError) and self.on_unreachable is not None:
                # Let the owner respawn a crashed resident server (in a thread: it blocks).
                await asyncio.to_thread(self.on_unreachable, client.base_url)
            # A model load on the target takes minutes: wait for it rather than spend the
            # attempts in seconds.
            with contextlib.suppress(LlamaError):
                await client.wait_until_healthy(self.policy.load_wait_s)
        elif isinstance(error, LlamaTimeoutError):
            # Past its deadline with nothing else in flight to keep the watchdog looking.
            await self._restart_if_silent(self.watches[client])
        await asyncio.sleep(self.policy.delay(attempt))
        if rewarm:
            await self._rewarm_quietly(warmer, slot_id)
        else:
            self.watches[client].digests.pop(slot_id, None)  # not known after a failure

    async def _restart_if_silent(self, watch: EndpointWatch) -> None:
        """Restart an endpoint whose /health does not answer (frozen); one restart at a time."""
        if not watch.ready.is_set():
            await watch.ready.wait()  # another request's restart is under way
            return
        try:
            await watch.client.health(timeout_s=self.policy.watchdog.probe_timeout_s)
        except LlamaTimeoutError:
            await self._restart_hung(watch)
        except LlamaError:
            pass  # down or loading: the next attempt's own errors bring it back

    async def _rewarm_quietly(self, warmer: SlotWarmer, slot_id: int) -> None:
        digests = self.watches[warmer.client].digests
        try:
            if await warmer.rewarm(slot_id):
                self.reprefills += 1
        except LlamaError as error:
            digests.pop(slot_id, None)  # the next send may prefill the digest: more time
            logger.warning("could not re-warm slot %d: %s", slot_id, error)
        else:
            digests[slot_id] = warmer.digest.sha256

    async def watch(self) -> None:
        """Probe every endpoint while requests are in flight; restart the ones that hang."""
        every = self.policy.watchdog.every_s
        while True:
            await asyncio.sleep(every)
            watches = list(self.watches.values())
            try:
                stalled = await asyncio.gather(*(watch.stalled() for watch in watches))
                for watch, hung in zip(watches, stalled, strict=True):
                    if hung:
                        await self._restart_hung(watch)
            except Exception:
                # A watchdog that dies leaves the batch without hang detection: log, go on.
                logger.exception("watchdog round failed; probing again in %.0f s", every)

    async def _restart_hung(self, watch: EndpointWatch) -> None:
        watch.ready.clear()
        watch.digests.clear()  # a restarted server starts with empty slots
        watch.hangs += 1
        cancelled = watch.cancel_sends()
        logger.warning(
            "restarting hung %s; %d request(s) will be sent again", watch.base_url, cancelled
        )
        try:
            if self.on_hung is not None:
                await asyncio.to_thread(self.on_hung, watch.base_url)
            with contextlib.suppress(LlamaError):
                await watch.client.wait_until_healthy(self.policy.load_wait_s)
        except Exception:
            logger.exception(
                "restarting %s failed; its requests are retried anyway", watch.base_url
            )
        finally:
            watch.mark_progress()
            watch.ready.set()
