"""Which digest each slot holds, a request's own digest brought into its slot, and the batch's
save files of those digests.

A request may carry its own system digest (a Batch API line's system prompt). The schedule runs
one digest's requests together (`schedule.py`: one kind at a time), and llama-server's prompt
cache keeps the digest while a slot runs them back to back. When a slot holding another digest
takes one, `SlotDigests.bring` brings the request's digest in once:

- restored from this batch's save of it (milliseconds), when there is one;
- else, for a digest several slots run (`shared`: more than one group of the schedule so far),
  prefilled once by a warm-up on this slot and saved (`/slots/{id}?action=save`); the other
  slots that take its work meanwhile wait for that save and restore it;
- else prefilled by the request itself (a one-off prompt: no warm-up, no file).

The saves are the batch's own (`SaveFiles`, named apart from the pipeline digest's save): at
most `max_saves` at once (the least recently used one is removed to make room), each removed
when its digest has no request left, all of them when the batch ends, however it ends. A server
whose save folder this process cannot see (an attached one) gets no saves: each of its slots
prefills. The engine's own digest keeps the pipeline's save (`warm.py`, kept for restarts): a
slot that ran another digest restores it from there.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from pathlib import Path

from kimi_batch.engine.digest import SystemDigest
from kimi_batch.engine.outcome import Endpoint
from kimi_batch.engine.warm import SlotWarmer, digest_save_name
from kimi_batch.engine.watchdog import EndpointWatch
from kimi_batch.llama import LlamaClient, LlamaError, LlamaHTTPError

logger = logging.getLogger(__name__)


class SaveFiles:
    """The slot-save files one batch made on one server, the least recently used first."""

    def __init__(self, directory: Path, limit: int) -> None:
        if limit < 1:
            raise ValueError("a save folder holds at least one file")
        self.directory = directory
        self.limit = limit
        self._names: OrderedDict[str, str] = OrderedDict()  # digest sha -> file name
        self.peak = 0

    def __len__(self) -> int:
        return len(self._names)

    def name(self, sha: str) -> str | None:
        """The file holding digest `sha` (now the most recently used); None without one."""
        name = self._names.get(sha)
        if name is not None:
            self._names.move_to_end(sha)
        return name

    def reserve(self, sha: str, name: str) -> None:
        """Make room for one more file (the least recently used goes), then count `name` before
        the server writes it: a batch cancelled during the save still removes it."""
        while len(self._names) >= self.limit:
            self.remove(next(iter(self._names)))
        self._names[sha] = name
        self.peak = max(self.peak, len(self._names))

    def remove(self, sha: str) -> None:
        name = self._names.pop(sha, None)
        if name is not None:
            (self.directory / name).unlink(missing_ok=True)

    def clear(self) -> None:
        for sha in list(self._names):
            self.remove(sha)


class SlotDigests:
    """The digests of one batch's slots (`EndpointWatch.digests`) and its save files."""

    def __init__(
        self,
        engine_digest: SystemDigest,
        *,
        shared: Callable[[str], bool],
        tokens: Callable[[str], int],
        prefill_timeout_s: Callable[[int], float],
        max_saves: int,
    ) -> None:
        self.engine_digest = engine_digest
        self.shared = shared  # whether a digest runs on several slots (schedule groups)
        self.remaining: Counter[str] = Counter()  # requests queued, not finished, per digest
        self._tokens = tokens
        self._prefill_timeout_s = prefill_timeout_s
        self._max_saves = max_saves
        self._endpoints: dict[LlamaClient, Endpoint] = {}
        self._engine_warmers: dict[LlamaClient, SlotWarmer] = {}
        self._saves: dict[LlamaClient, SaveFiles] = {}
        self._all_saves: list[SaveFiles] = []
        self._warming: dict[tuple[LlamaClient, str], asyncio.Event] = {}
        self.warmups = 0
        self.restores = 0

    def add_endpoint(self, endpoint: Endpoint, engine_warmer: SlotWarmer) -> None:
        client = engine_warmer.client
        self._endpoints[client] = endpoint
        self._engine_warmers[client] = engine_warmer
        if endpoint.slot_save_dir is not None and self._max_saves > 0:
            saves = SaveFiles(endpoint.slot_save_dir, self._max_saves)
            self._saves[client] = saves
            self._all_saves.append(saves)

    def save_files(self, client: LlamaClient) -> SaveFiles | None:
        """This batch's saves on `client`'s server; None when it gets none."""
        return self._saves.get(client)

    @property
    def saves_peak(self) -> int:
        """The most save files of this batch there were at once on one server."""
        return max((saves.peak for saves in self._all_saves), default=0)

    async def bring(self, watch: EndpointWatch, slot_id: int, digest: SystemDigest) -> bool:
        """Bring `digest` into the slot before a request of it (see the module docstring);
        whether the slot holds it now (False: the request prefills it)."""
        await watch.ready.wait()  # never into a server that is being restarted
        held = watch.digests.get(slot_id)
        if held == digest.sha256 or not digest.text:
            return True
        if digest.sha256 == self.engine_digest.sha256:
            # Unknown (None): cold since the warm-up, the request prefills as it always did.
            engine_warmer = self._engine_warmers[watch.client]
            return held is not None and await self._restore(watch, slot_id, engine_warmer)
        saves = self._saves.get(watch.client)
        if saves is None:
            return False
        while (warming := self._warming.get((watch.client, digest.sha256))) is not None:
            # Another slot is prefilling or saving it: its file is named before it is written,
            # and a restore is not asked for a file that is not there yet (`SlotWarmer.restore`).
            await warming.wait()
        if saves.name(digest.sha256) is None and self.shared(digest.sha256):
            await self._warm(watch, slot_id, digest, saves)
            if watch.digests.get(slot_id) == digest.sha256:
                return True
        if saves.name(digest.sha256) is None:
            return False
        return await self._restore(watch, slot_id, self._warmer(watch.client, digest))

    def queued(self, shas: Iterable[str]) -> None:
        """Requests of these digests joined the run."""
        self.remaining.update(shas)

    def finished(self, sha: str) -> None:
        """One request of digest `sha` is done (answered, failed or left): its save goes with
        the last one."""
        self.remaining[sha] -= 1
        if self.remaining[sha] <= 0:
            for saves in self._saves.values():
                saves.remove(sha)

    def close(self) -> None:
        """Remove every save file of this batch (the batch has ended, however)."""
        for saves in self._all_saves:
            saves.clear()

    def _warmer(self, client: LlamaClient, digest: SystemDigest) -> SlotWarmer:
        endpoint = self._endpoints[client]
        tokens = self._tokens(digest.sha256)
        return SlotWarmer(
            client,
            digest,
            digest_tokens=tokens,
            model=endpoint.model,
            ctx=endpoint.ctx,
            prefill_timeout_s=self._prefill_timeout_s(tokens),
            save_name=digest_save_name(digest.sha256, endpoint.model, endpoint.ctx, kind="prompt"),
            save_dir=endpoint.slot_save_dir,
        )

    async def _restore(self, watch: EndpointWatch, slot_id: int, warmer: SlotWarmer) -> bool:
        try:
            restored = await warmer.restore(slot_id)
        except LlamaError as error:  # the request's own send meets the same server
            logger.info("no restore of a digest into slot %d: %s", slot_id, error)
            restored = None
        if restored is None:
            return False
        watch.digests[slot_id] = warmer.digest.sha256
        self.restores += 1
        return True

    async def _warm(
        self, watch: EndpointWatch, slot_id: int, digest: SystemDigest, saves: SaveFiles
    ) -> None:
        """Prefill `digest` into this slot and save it; a slot that comes for it meanwhile
        waits for that save (`bring`: one prefill, however many slots)."""
        key = (watch.client, digest.sha256)
        self._warming[key] = done = asyncio.Event()
        warmer = self._warmer(watch.client, digest)
        try:
            watch.digests.pop(slot_id, None)  # whatever it held is being overwritten
            await warmer.prefill(slot_id)
            watch.digests[slot_id] = digest.sha256
            self.warmups += 1
            saves.reserve(digest.sha256, warmer.save_name)
            await watch.client.save_slot(slot_id, warmer.save_name)
        except LlamaError as error:
            saves.remove(digest.sha256)
            if isinstance(error, LlamaHTTPError) and watch.digests.get(slot_id) == digest.sha256:
                # The save was refused (no --slot-save-path): no saves on this server from now.
                self._saves.pop(watch.client, None)
            logger.warning("warm-up of a request digest on slot %d: %s", slot_id, error)
        finally:
            done.set()
            del self._warming[key]
