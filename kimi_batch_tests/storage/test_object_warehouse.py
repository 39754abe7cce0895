"""The warehouse on an object store: versions under their own prefixes, one current per
partition, old ones deleted after their grace, nothing switched by a writer that lost its lease.

On the session's real S3 server (s3proxy); the contract shared with the local warehouse is tested
in test_parquet.py over both kinds. Which one a deployment gets is `open_warehouse`'s choice."""

from __future__ import annotations

import uuid
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from kimi_batch.engine.ledger import LeaseLostError, Ledger
from kimi_batch.paths import StatePaths
from kimi_batch.settings import Settings
from kimi_batch.storage import StorageError, Warehouse
from kimi_batch.storage.object_warehouse import ObjectWarehouse, open_warehouse
from kimi_batch_tests.support.rows import amplified
from kimi_batch_tests.support.s3proxy import BUCKET, S3Server

DS = "2026-12-03"


def _warehouse(server: S3Server, home: Path, *, grace_s: float) -> ObjectWarehouse:
    return ObjectWarehouse(
        f"s3://{BUCKET}/t-{uuid.uuid4().hex[:12]}",
        endpoint=server.endpoint,
        region=server.env["AWS_REGION"],
        pointers=StatePaths(home=home).ledger_state,
        staging=home / "staging",
        grace_s=grace_s,
    )


@pytest.fixture
def s3_env(s3proxy_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """The AWS variables of the session's server, as a deployment sets them."""
    for name, value in s3proxy_server.env.items():
        monkeypatch.setenv(name, value)
    return s3proxy_server


def test_the_deployment_chooses_its_warehouse_by_what_it_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path))
    monkeypatch.delenv("KIMI_BATCH_WAREHOUSE", raising=False)
    folder = open_warehouse(Settings.from_env())
    assert type(folder) is Warehouse
    assert folder.location == str(tmp_path / "warehouse")

    monkeypatch.setenv("KIMI_BATCH_WAREHOUSE", f"s3://{BUCKET}/nightly")
    monkeypatch.setenv("KIMI_BATCH_S3_ENDPOINT", "http://127.0.0.1:9")
    settings = Settings.from_env()
    store = open_warehouse(settings)
    assert isinstance(store, ObjectWarehouse)
    assert store.location == f"s3://{BUCKET}/nightly"
    # Its pointers are beside the partition leases; partitions are built in the local folder.
    assert store.versions.location == settings.paths.ledger_state
    assert store.root == tmp_path / "warehouse"
    assert store.partitions("distilled") == []  # read from the pointers: no request made
    with pytest.raises(StorageError, match="object store"):
        store.partition_file("distilled", DS, "web")


def _objects(warehouse: ObjectWarehouse) -> list[str]:
    base = warehouse.url.removeprefix("s3://")
    found = warehouse.filesystem.get_file_info(pafs.FileSelector(base, recursive=True))
    return sorted(
        info.path.removeprefix(base + "/") for info in found if info.type == pafs.FileType.File
    )


@pytest.mark.slow  # the S3 server
def test_a_replaced_version_is_read_no_more_and_deleted_after_its_grace(
    s3_env: S3Server, tmp_path: Path
) -> None:
    warehouse = _warehouse(s3_env, tmp_path, grace_s=0)
    first = warehouse.write_partition("amplified", DS, "web", amplified(3))
    second = warehouse.write_partition("amplified", DS, "web", amplified(2, prefix="new"))
    assert second.url == f"{warehouse.url}/{second.path}"
    assert warehouse.read_partition("amplified", DS, "web")["request_id"].to_list() == [
        "new-0",
        "new-1",
    ]
    # The write after the switch swept the first version (its grace is 0 here): one file left.
    assert _objects(warehouse) == [str(second.path)]
    assert str(first.path) != str(second.path)
    assert warehouse.current_prefix("amplified", DS, "web") == str(second.path.parent)


@pytest.mark.slow  # the S3 server
def test_a_version_within_its_grace_stays_readable(s3_env: S3Server, tmp_path: Path) -> None:
    warehouse = _warehouse(s3_env, tmp_path, grace_s=3600)
    first = warehouse.write_partition("amplified", DS, "web", amplified(3))
    second = warehouse.write_partition("amplified", DS, "web", amplified(2, prefix="new"))
    assert _objects(warehouse) == sorted([str(first.path), str(second.path)])
    assert warehouse.count("amplified") == 2


@pytest.mark.slow  # the S3 server
def test_a_writer_that_lost_its_lease_leaves_the_partition_and_no_object(
    s3_env: S3Server, tmp_path: Path
) -> None:
    warehouse = _warehouse(s3_env, tmp_path, grace_s=0)
    kept = warehouse.write_partition("amplified", DS, "web", amplified(3))
    location = StatePaths(home=tmp_path).ledger_state
    with (
        Ledger(location) as ledger,
        Ledger(location) as other,
        ledger.lease(f"{DS}|web", "paused-run", ttl_s=0.6) as paused,
    ):
        # Stalled (its heartbeat too) past the ttl; another run takes the partition over.
        paused._stop.set()  # pyright: ignore[reportPrivateUsage]
        with (
            other.lease(f"{DS}|web", "new-run", wait_s=30, poll_s=0.05),
            pytest.raises(LeaseLostError),
        ):
            warehouse.write_partition(
                "amplified", DS, "web", amplified(5, prefix="stale"), guard=paused
            )
    assert warehouse.read_partition("amplified", DS, "web").height == 3
    assert _objects(warehouse) == [str(kept.path)]
