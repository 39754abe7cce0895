"""A batch's own slot-save files: bounded, least recently used removed first, removed when
their digest has no request left and when the batch ends (files on disk; no server)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from kimi_batch.engine.batch_engine import Endpoint
from kimi_batch.engine.digest import SystemDigest
from kimi_batch.engine.slot_digests import SaveFiles, SlotDigests
from kimi_batch.engine.warm import SlotWarmer
from kimi_batch.engine.watchdog import EndpointWatch, WatchdogPolicy
from kimi_batch.llama import LlamaClient


def _saved(saves: SaveFiles, sha: str) -> None:
    """Reserve a file and write it, as the server's save does."""
    name = f"prompt-{sha}.bin"
    saves.reserve(sha, name)
    (saves.directory / name).write_bytes(b"kv")


def _on_disk(folder: Path) -> set[str]:
    return {path.name for path in folder.iterdir()}


ENGINE_DIGEST = SystemDigest.from_text("The pipeline's digest.")


def _slot_digests(client: LlamaClient, endpoint: Endpoint, shared: set[str]) -> SlotDigests:
    """The batch's digests on one endpoint, `shared` the digests several slots run."""
    digests = SlotDigests(
        ENGINE_DIGEST,
        shared=shared.__contains__,
        tokens=lambda _sha: 10,
        prefill_timeout_s=lambda _tokens: 1.0,
        max_saves=4,
    )
    digests.add_endpoint(
        endpoint, SlotWarmer(client, ENGINE_DIGEST, digest_tokens=5, model="m", ctx=None)
    )
    return digests


def test_the_least_recently_used_save_makes_room_and_the_bound_holds(tmp_path: Path) -> None:
    saves = SaveFiles(tmp_path, limit=2)
    _saved(saves, "a")
    _saved(saves, "b")
    assert saves.name("a") == "prompt-a.bin"  # a restore of "a": "b" is now the oldest

    _saved(saves, "c")

    assert _on_disk(tmp_path) == {"prompt-a.bin", "prompt-c.bin"}
    assert saves.name("b") is None
    assert (len(saves), saves.peak) == (2, 2)
    saves.clear()
    assert _on_disk(tmp_path) == set()


async def test_a_digest_s_save_goes_with_its_last_request_and_the_rest_at_the_end(
    tmp_path: Path,
) -> None:
    pipeline_save = tmp_path / "digest-pipeline.bin"
    pipeline_save.write_bytes(b"kv")  # the pipeline digest's own save: never the batch's
    endpoint = Endpoint(base_url="http://127.0.0.1:9", slots=2, model="m", slot_save_dir=tmp_path)
    async with LlamaClient(endpoint.base_url) as client:  # never called here
        digests = _slot_digests(client, endpoint, {"a", "b"})
        digests.queued(["a", "a", "b"])
        saves = digests.save_files(client)
        assert saves is not None
        _saved(saves, "a")
        _saved(saves, "b")

        digests.finished("a")
        assert (tmp_path / "prompt-a.bin").exists()  # one request of "a" is left
        digests.finished("a")
        assert not (tmp_path / "prompt-a.bin").exists()
        digests.close()  # the batch ended before "b"'s request did (cancelled, say)

    assert _on_disk(tmp_path) == {pipeline_save.name}
    assert digests.saves_peak == 2


async def test_a_slot_that_comes_while_the_save_is_written_restores_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race CI met on a real server: the second slot of a shared digest came while the
    first one's save was being written, found the file named but not there, and prefilled."""
    save_started = asyncio.Event()
    restored: list[int] = []

    async def server(request: httpx.Request) -> httpx.Response:
        slot_id = int(request.url.path.rsplit("/", 1)[1])
        name = json.loads(request.content)["filename"]
        if request.url.params["action"] == "save":
            save_started.set()
            await asyncio.sleep(0.05)  # the server writes the file
            (tmp_path / name).write_bytes(b"kv")
        elif (tmp_path / name).is_file():
            restored.append(slot_id)
        return httpx.Response(200, json={"id_slot": slot_id})

    prefilled: list[int] = []

    async def prefill(_warmer: SlotWarmer, slot_id: int) -> float:
        prefilled.append(slot_id)
        return 1.0

    monkeypatch.setattr(SlotWarmer, "prefill", prefill)
    monkeypatch.setattr(SlotWarmer, "wait_idle", lambda *_args, **_kwargs: asyncio.sleep(0))
    shared = SystemDigest.from_text("A system prompt several slots run.")
    endpoint = Endpoint(base_url="http://llama", slots=2, model="m", slot_save_dir=tmp_path)
    async with LlamaClient(endpoint.base_url, transport=httpx.MockTransport(server)) as client:
        digests = _slot_digests(client, endpoint, {shared.sha256})
        watch = EndpointWatch(client, WatchdogPolicy())
        first = asyncio.create_task(digests.bring(watch, 0, shared))
        await save_started.wait()
        second = await digests.bring(watch, 1, shared)

        assert (await first, second) == (True, True)
    assert (prefilled, restored) == ([0], [1])
    assert (digests.warmups, digests.restores) == (1, 1)
