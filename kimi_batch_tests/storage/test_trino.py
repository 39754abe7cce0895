"""Publishing to a real Trino (scripts/trino.sh, session fixture `trino_server`)."""

from __future__ import annotations

import http.server
import json
import os
import stat
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from kimi_batch.settings import Settings
from kimi_batch.storage import (
    TABLES,
    InvalidIdentifierError,
    InvalidPartitionError,
    SchemaMismatchError,
    StorageError,
    TrinoConfig,
    TrinoPublisher,
    TrinoUnavailableError,
)
from kimi_batch.storage.exceptions import TrinoTimeoutError
from kimi_batch.warehouse import Warehouse
from kimi_batch_tests.support.ports import free_port
from kimi_batch_tests.support.rows import CREATED_AT, amplified, distilled, quarantined, seeds
from kimi_batch_tests.support.script_server import run_script
from kimi_batch_tests.support.trino import SCRIPT as TRINO_SCRIPT
from kimi_batch_tests.support.trino import TrinoServer

DS = "2024-05-01"


@pytest.fixture
def isolated(
    trino_server: TrinoServer, request: pytest.FixtureRequest
) -> Iterator[tuple[Warehouse, TrinoPublisher]]:
    """A warehouse and schema of this test's own inside the shared server."""
    name = "t_" + request.node.name.lower().replace("[", "_").replace("]", "").replace("-", "_")
    warehouse, config = trino_server.isolated(name[:60])
    with TrinoPublisher(config) as publisher:
        yield warehouse, publisher


@pytest.mark.slow
def test_publish_creates_tables_with_parquet_counts(
    isolated: tuple[Warehouse, TrinoPublisher],
) -> None:
    warehouse, publisher = isolated
    variants = amplified(4)
    warehouse.write_partition("amplified", DS, "demo", variants)
    warehouse.write_partition("distilled", DS, "demo", distilled(variants))
    warehouse.write_partition("quarantine", DS, "demo", quarantined(2))
    warehouse.write_partition("seeds", DS, "demo", seeds(3))
    # The contract's tables, as written above (a test may register a stage of its own, whose
    # table this test does not write).
    written = ("amplified", "distilled", "quarantine", "seeds")
    for table in written:
        report = publisher.publish_partition(warehouse, table, DS, "demo")
        assert report.partitions_registered == 1

    tables = {name for (name,) in publisher.query(f'SHOW TABLES FROM hive."{publisher.schema}"')}
    assert tables == set(written)
    for table in written:
        assert publisher.count(table) == warehouse.count(table) > 0
        assert publisher.registered_partitions(table) == [(DS, "demo")]


@pytest.mark.slow
def test_republishing_a_rewritten_partition_keeps_counts(
    isolated: tuple[Warehouse, TrinoPublisher],
) -> None:
    warehouse, publisher = isolated
    warehouse.write_partition("amplified", DS, "demo", amplified(3))
    publisher.publish_partition(warehouse, "amplified", DS, "demo")
    assert publisher.count("amplified") == 3

    # Same rows again: nothing doubles, the registration is idempotent.
    warehouse.write_partition("amplified", DS, "demo", amplified(3))
    report = publisher.publish_partition(warehouse, "amplified", DS, "demo")
    assert report.partitions_registered == 0
    assert publisher.count("amplified") == warehouse.count("amplified") == 3

    # Different rows: Trino sees the new file at once, not the old listing.
    warehouse.write_partition("amplified", DS, "demo", amplified(5, prefix="v2"))
    publisher.publish_partition(warehouse, "amplified", DS, "demo")
    assert publisher.count("amplified") == warehouse.count("amplified") == 5
    ids = publisher.query(f'SELECT request_id FROM "{publisher.schema}".amplified ORDER BY 1')
    assert [request_id for (request_id,) in ids] == [f"v2-{i}" for i in range(5)]


@pytest.mark.slow
def test_distilled_joins_amplified(isolated: tuple[Warehouse, TrinoPublisher]) -> None:
    warehouse, publisher = isolated
    variants = amplified(3)
    answers = distilled(variants)
    warehouse.write_partition("amplified", DS, "demo", variants)
    warehouse.write_partition("distilled", DS, "demo", answers)
    publisher.publish_all(warehouse)

    schema = f'"{publisher.schema}"'
    rows = publisher.query(
        f"SELECT d.request_id, a.request_id, a.prompt, d.created_at, d.logprobs[1].top[2].token "
        f"FROM {schema}.distilled d JOIN {schema}.amplified a "
        "ON d.input_id = a.request_id AND d.ds = a.ds AND d.source = a.source "
        "WHERE d.ds = ? ORDER BY 1",
        [DS],
    )
    assert [(d, a, prompt) for d, a, prompt, _, _ in rows] == [
        (answer.request_id, variant.request_id, variant.prompt)
        for answer, variant in zip(answers, variants, strict=True)
    ]
    created_at: datetime = rows[0][3]
    assert created_at == CREATED_AT.replace(tzinfo=None)  # microseconds survive the round trip
    assert rows[0][4] == "Lyon"


@pytest.mark.slow
def test_empty_partition_is_published(isolated: tuple[Warehouse, TrinoPublisher]) -> None:
    warehouse, publisher = isolated
    warehouse.write_partition("quarantine", DS, "nothing_bad", [])
    publisher.publish_partition(warehouse, "quarantine", DS, "nothing_bad")
    assert publisher.registered_partitions("quarantine") == [(DS, "nothing_bad")]
    assert publisher.count("quarantine") == 0


@pytest.mark.slow
def test_publish_all_catches_up(isolated: tuple[Warehouse, TrinoPublisher]) -> None:
    warehouse, publisher = isolated
    warehouse.write_partition("amplified", "2024-05-01", "a", amplified(2))
    publisher.publish_partition(warehouse, "amplified", "2024-05-01", "a")
    # Written while Trino was away: never published.
    warehouse.write_partition("amplified", "2024-05-01", "b", amplified(3))
    warehouse.write_partition("amplified", "2024-05-02", "a", amplified(1))
    warehouse.write_partition("quarantine", "2024-05-02", "a", quarantined(4))

    report = publisher.publish_all(warehouse)
    assert report.tables == tuple(TABLES)
    assert report.partitions_present == 4
    assert report.partitions_registered == 3
    for table in TABLES:
        assert publisher.count(table) == warehouse.count(table)
        assert publisher.registered_partitions(table) == warehouse.partitions(table)
    assert publisher.count("amplified", ds="2024-05-01", source="b") == 3

    again = publisher.publish_all(warehouse)
    assert again.partitions_registered == 0
    assert publisher.count("amplified") == 6


@pytest.mark.parametrize(
    "field",
    ["schema_name", "catalog"],
)
@pytest.mark.parametrize(
    "bad",
    ['kimi"batch', "kimi_batch; DROP SCHEMA hive.x", "kimi batch", "Kimi", "1abc", "", "x'y"],
)
def test_bad_identifiers_are_rejected_before_sql(field: str, bad: str) -> None:
    # A dead port: had any SQL been sent, this would be a TrinoUnavailableError instead.
    config = TrinoConfig.model_validate({"host": "127.0.0.1", "port": free_port(), field: bad})
    with pytest.raises(InvalidIdentifierError, match="invalid"):
        TrinoPublisher(config)


@pytest.mark.parametrize("table", ['amplified"', "amplified; DROP TABLE x", "amplified x", "AMP"])
def test_bad_table_names_are_rejected_before_sql(table: str) -> None:
    publisher = TrinoPublisher(TrinoConfig(host="127.0.0.1", port=free_port()))
    with pytest.raises(InvalidIdentifierError):
        publisher.ensure_table(table)
    with pytest.raises(InvalidIdentifierError):
        publisher.count(table)
    with pytest.raises(InvalidIdentifierError):
        publisher.register_partition(table, DS, "demo")


def test_bad_partition_values_are_rejected_before_sql() -> None:
    publisher = TrinoPublisher(TrinoConfig(host="127.0.0.1", port=free_port()))
    with pytest.raises(InvalidPartitionError):
        publisher.register_partition("amplified", "2024-05-01'; --", "demo")
    with pytest.raises(InvalidPartitionError):
        publisher.register_partition("amplified", DS, "x' OR '1'='1")
    with pytest.raises(InvalidPartitionError):
        publisher.count("amplified", source="a b")


def test_unreachable_trino_raises_and_parquet_stays(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    warehouse = Warehouse(tmp_path_factory.mktemp("offline"))
    written = warehouse.write_partition("amplified", DS, "demo", amplified(2))
    publisher = TrinoPublisher(TrinoConfig(host="127.0.0.1", port=free_port(), max_attempts=1))
    with pytest.raises(TrinoUnavailableError, match="unreachable") as caught:
        publisher.publish_partition(warehouse, "amplified", DS, "demo")
    assert isinstance(caught.value, StorageError)
    with pytest.raises(TrinoUnavailableError):
        publisher.publish_all(warehouse)
    assert written.path.is_file()
    assert warehouse.count("amplified") == 2


@pytest.mark.slow
def test_publishing_an_unwritten_partition_fails(
    isolated: tuple[Warehouse, TrinoPublisher],
) -> None:
    warehouse, publisher = isolated
    with pytest.raises(StorageError, match="nothing to publish"):
        publisher.publish_partition(warehouse, "amplified", DS, "never")


@pytest.mark.slow
def test_schema_drift_is_reported(isolated: tuple[Warehouse, TrinoPublisher]) -> None:
    warehouse, publisher = isolated
    publisher.ensure_schema()
    publisher.query(
        f'CREATE TABLE "{publisher.schema}".amplified (request_id VARCHAR, ds VARCHAR, source VARCHAR) '
        "WITH (external_location = ?, format = 'PARQUET', partitioned_by = ARRAY['ds', 'source'])",
        [publisher.config.table_location("amplified")],
    )
    warehouse.write_partition("amplified", DS, "demo", amplified(1))
    with pytest.raises(SchemaMismatchError, match="drop the Trino table"):
        publisher.publish_partition(warehouse, "amplified", DS, "demo")


class QueuedForever(http.server.BaseHTTPRequestHandler):
    """A coordinator that keeps every statement QUEUED with a fresh nextUri, for ever (a real
    Trino cannot be told to); DELETE (the client's cancel) is counted and accepted."""

    base = ""
    polls = 0
    cancels = 0

    def _queued(self) -> None:
        type(self).polls += 1
        base = type(self).base
        body = {
            "id": "q1",
            "infoUri": f"{base}/ui/q1",
            "nextUri": f"{base}/v1/statement/queued/q1/{type(self).polls}",
            "stats": {"state": "QUEUED", "queued": True, "scheduled": False},
        }
        payload = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._queued()

    def do_GET(self) -> None:
        time.sleep(0.05)
        self._queued()

    def do_DELETE(self) -> None:
        type(self).cancels += 1
        self.send_response(204)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_statement_trino_keeps_queued_is_cancelled_at_its_deadline() -> None:
    port = free_port()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), QueuedForever)
    QueuedForever.base = f"http://127.0.0.1:{port}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        config = TrinoConfig(host="127.0.0.1", port=port, statement_timeout_s=2.0)
        with (
            TrinoPublisher(config) as publisher,
            pytest.raises(TrinoTimeoutError, match=r"within 2 s \(last state QUEUED\)"),
        ):
            publisher.query("SELECT 1")
        polls_at_cancel = QueuedForever.polls
        time.sleep(1.0)
    finally:
        server.shutdown()
    assert QueuedForever.cancels == 1
    assert QueuedForever.polls <= polls_at_cancel + 1  # the client stopped polling
    assert isinstance(TrinoTimeoutError("x"), StorageError)  # publish() reports it as a check


@pytest.mark.slow
def test_a_real_statement_past_its_deadline_is_cancelled_and_publishing_fails_with_the_reason(
    trino_server: TrinoServer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # Seconds of work for the coordinator: well past a 1 s deadline.
    slow = (
        "SELECT count(*) FROM UNNEST(sequence(1, 10000)) AS a(x) "
        "CROSS JOIN UNNEST(sequence(1, 10000)) AS b(y) WHERE (x * y) % 7 = 3"
    )
    with (
        TrinoPublisher(trino_server.config(statement_timeout_s=1.0)) as publisher,
        pytest.raises(TrinoTimeoutError, match="within 1 s"),
    ):
        publisher.query(slow)
    states: list[tuple[object, ...]] = []
    with TrinoPublisher(trino_server.config()) as watcher:
        for _ in range(60):  # the coordinator records the cancel within moments
            states = watcher.query(
                "SELECT state, error_code FROM system.runtime.queries WHERE query = ?", [slow]
            )
            if states and states[0][0] in ("FAILED", "FINISHED"):
                break
            time.sleep(0.5)
    assert states == [("FAILED", "USER_CANCELED")]


def test_an_s3_warehouse_gets_a_native_s3_catalog_its_key_in_a_private_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ["HOME"],
        "KIMI_BATCH_HOME": str(tmp_path),
        "KIMI_BATCH_WAREHOUSE": "s3://kimi-batch/nightly",
        "KIMI_BATCH_S3_ENDPOINT": "http://127.0.0.1:9000",
        "AWS_ACCESS_KEY_ID": "box-key",
        "AWS_SECRET_ACCESS_KEY": "box-secret",
    }
    written = run_script(TRINO_SCRIPT, "config", env, 60)
    assert written.returncode == 0, written.stderr
    catalog = tmp_path / "trino" / "etc" / "catalog" / "hive.properties"
    lines = set(catalog.read_text().splitlines())
    assert {
        "hive.metastore.catalog.dir=s3://kimi-batch/nightly/_trino_metastore",
        "fs.native-s3.enabled=true",
        "s3.endpoint=http://127.0.0.1:9000",
        "s3.path-style-access=true",
        "s3.region=us-east-1",
        "s3.aws-secret-key=box-secret",
    } <= lines
    assert not any(line.startswith("fs.native-local") for line in lines)
    assert stat.S_IMODE(catalog.stat().st_mode) == 0o600
    # The publisher names the same objects: tables under the warehouse's URL.
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("KIMI_BATCH_TRINO_HOST", "127.0.0.1")
    config = TrinoConfig.from_settings(Settings.from_env())
    assert config.table_location("seeds") == "s3://kimi-batch/nightly/seeds"
