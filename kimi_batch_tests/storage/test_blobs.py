"""Landed snapshots and Batch API files on several hosts: with the state in a real PostgreSQL, a
file one host keeps is read on another that shares nothing else with it, part by part and checked
against its name; an upload killed midway is never read. Embedded, they stay files only."""

from __future__ import annotations

import hashlib
import io
from datetime import date
from pathlib import Path

import pytest

import kimi_batch.storage.blobs as blobs_module
from kimi_batch.batch_api import ApiStore
from kimi_batch.inputs import Landing
from kimi_batch.paths import StatePaths
from kimi_batch.state import connect_state
from kimi_batch.storage import StorageError
from kimi_batch.storage.blobs import BlobStore
from kimi_batch_tests.support.postgres import PostgresServer

DAY = date(2026, 11, 28)


def _hosts(tmp_path: Path, url: str | None) -> tuple[StatePaths, StatePaths]:
    """Two hosts: their own state dirs, the one database."""
    return (
        StatePaths(home=tmp_path / "host-a", database_url=url),
        StatePaths(home=tmp_path / "host-b", database_url=url),
    )


def _land(paths: StatePaths, text: str) -> str:
    inbox = paths.inbox_dir
    inbox.mkdir(parents=True, exist_ok=True)
    (inbox / "web.jsonl").write_text(text)
    with Landing(paths) as landing:
        assignment = landing.assign("web.jsonl", arrived=DAY, start=DAY)
        version = landing.land(inbox / "web.jsonl", assignment, max_bytes=1 << 20, settle_s=0.0)
    return version.path.name


def test_an_input_landed_on_one_host_is_read_on_another(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    here, there = _hosts(tmp_path, postgres_server.new_database())
    text = "".join(f'{{"prompt": "question {i}"}}\n' for i in range(50))
    _land(here, text)

    with Landing(there) as landing:
        current = landing.current(DAY.isoformat(), "web")
        assert current is not None
        assert not current.path.exists()  # nothing of it on this host yet
        readable = landing.readable(current)
    assert readable is not None
    assert readable.path.read_text() == text
    assert readable.path.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in there.landed_dir.iterdir() if p.name.startswith(".")] == []


def test_a_batch_file_written_on_one_host_is_served_on_another_until_deleted(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    api_host, run_host = _hosts(tmp_path, postgres_server.new_database())
    with ApiStore(run_host) as store:  # a run writes the output file
        output = store.add_lines(['{"id": 1}', '{"id": 2}'], filename="o.jsonl", purpose="x")
    with ApiStore(api_host) as store:  # the API serves it
        found = store.file(output.id)
        assert found is not None
        assert store.blob_path(found).read_text() == '{"id": 1}\n{"id": 2}\n'
        assert store.delete_file(output.id)
    with connect_state(run_host.api_state) as db:  # gone for every host
        assert db.execute("SELECT COUNT(*) FROM blob_parts").fetchone() == (0,)
        assert db.execute("SELECT COUNT(*) FROM blobs").fetchone() == (0,)


def test_an_upload_racing_a_delete_of_the_same_bytes_is_readable_on_another_host(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    api_host, run_host = _hosts(tmp_path, postgres_server.new_database())
    data = b'{"custom_id": "a"}\n'
    with ApiStore(api_host) as store:
        first = store.add_file(io.BytesIO(data), filename="1", purpose="batch", max_bytes=100)
        staged = store.stage_file(io.BytesIO(data), max_bytes=100)
        assert store.delete_file(first.id)  # the blob leaves the database ...
        second = store.keep_file(staged, filename="2", purpose="batch")  # ... and comes back
    with ApiStore(run_host) as store:
        found = store.file(second.id)
        assert found is not None
        assert store.blob_path(found).read_bytes() == data


@pytest.fixture
def shared_blobs(postgres_server: PostgresServer, tmp_path: Path) -> tuple[BlobStore, BlobStore]:
    """One store's blobs on two hosts, in 7-byte parts."""
    here, there = _hosts(tmp_path, postgres_server.new_database())
    stores = []
    for paths in (here, there):
        folder = paths.home / "blobs"
        folder.mkdir(parents=True)
        stores.append(BlobStore(connect_state(paths.api_state), folder, paths.api_state))
    return stores[0], stores[1]


def _blob(store: BlobStore, data: bytes) -> str:
    name = hashlib.sha256(data).hexdigest() + ".txt"
    store.path(name).write_bytes(data)
    return name


def test_a_blob_goes_over_in_parts_and_arrives_whole(
    shared_blobs: tuple[BlobStore, BlobStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(blobs_module, "PART_BYTES", 7)
    here, there = shared_blobs
    data = bytes(range(256)) * 3
    name = _blob(here, data)
    here.share(name)
    assert there.local(name).read_bytes() == data
    (parts,) = here._db.execute("SELECT parts FROM blobs WHERE name = ?", (name,)).fetchone()
    assert parts == -(-len(data) // 7)


def test_a_fetched_blob_that_does_not_match_its_name_is_refused_and_left_nowhere(
    shared_blobs: tuple[BlobStore, BlobStore],
) -> None:
    here, there = shared_blobs
    name = _blob(here, b"the right bytes\n")
    here.share(name)
    here._db.execute("UPDATE blob_parts SET data = ? WHERE name = ?", (b"other bytes!!!!!\n", name))
    with pytest.raises(StorageError, match="do not match its name"):
        there.local(name)
    assert list(there.folder.iterdir()) == []


def test_an_upload_killed_midway_is_never_read_and_the_next_one_completes_it(
    shared_blobs: tuple[BlobStore, BlobStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(blobs_module, "PART_BYTES", 4)
    here, there = shared_blobs
    data = b"twelve bytes"
    name = _blob(here, data)
    # Killed after its first part: the parts are there, not the row that makes the blob whole.
    here._db.execute("INSERT INTO blob_parts (name, part, data) VALUES (?, 0, ?)", (name, data[:4]))
    assert not here.has(name)
    with pytest.raises(StorageError, match="neither in"):
        there.local(name)
    here.share(name)  # the next upload of the same bytes
    assert there.local(name).read_bytes() == data


def test_embedded_state_keeps_its_blobs_as_files_only(tmp_path: Path) -> None:
    paths = StatePaths(home=tmp_path / "box")
    name = _land(paths, '{"prompt": "one"}\n')
    with connect_state(paths.manifest_state) as db:
        assert db.columns("blobs") == set()
    with Landing(paths) as landing:
        current = landing.readable(landing.current(DAY.isoformat(), "web"))
    assert current is not None
    assert current.path == paths.landed_dir / name
    assert current.path.read_text() == '{"prompt": "one"}\n'
