"""A batch's own slot-save files: bounded, least recently used removed first, removed when
their digest has no request left and when the batch ends (files on disk; no server)."""

from __future__ import annotations

from pathlib import Path

from kimi_batch.engine.batch_engine import Endpoint
from kimi_batch.engine.digest import SystemDigest
from kimi_batch.engine.slot_digests import SaveFiles, SlotDigests
from kimi_batch.engine.warm import SlotWarmer
from kimi_batch.llama import LlamaClient


def _saved(saves: SaveFiles, sha: str) -> None:
    """Reserve a file and write it, as the server's save does."""
    name = f"prompt-{sha}.bin"
    saves.reserve(sha, name)
    (saves.directory / name).write_bytes(b"kv")


def _on_disk(folder: Path) -> set[str]:
    return {path.name for path in folder.iterdir()}


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
    engine_digest = SystemDigest.from_text("The pipeline's digest.")
    endpoint = Endpoint(base_url="http://127.0.0.1:9", slots=2, model="m", slot_save_dir=tmp_path)
    async with LlamaClient(endpoint.base_url) as client:  # never called here
        digests = SlotDigests(
            engine_digest,
            shared={"a", "b"}.__contains__,
            tokens=lambda _sha: 10,
            prefill_timeout_s=lambda _tokens: 1.0,
            max_saves=4,
        )
        digests.add_endpoint(
            endpoint, SlotWarmer(client, engine_digest, digest_tokens=5, model="m", ctx=None)
        )
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
