"""Trino reading the warehouse's Iceberg tables (scripts/trino.sh, session fixture `trino_server`):
the same rows as polars and pyiceberg, a replace seen whole, older snapshots; the reader's errors."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from datetime import datetime

import polars as pl
import pytest

from kimi_batch.storage import InvalidIdentifierError, InvalidPartitionError, StorageError
from kimi_batch.warehouse import (
    TrinoConfig,
    TrinoQueryError,
    TrinoReader,
    TrinoTimeoutError,
    TrinoUnavailableError,
    Warehouse,
    open_catalog,
)
from kimi_batch.warehouse import trino as trino_module
from kimi_batch_tests.support.ports import free_port
from kimi_batch_tests.support.rows import CREATED_AT, amplified, distilled, quarantined, seeds
from kimi_batch_tests.support.trino import TrinoServer

# Its slow tests start no llama-server: they run beside the ones that do (support/slow_split.py).
pytestmark = pytest.mark.no_llama_server

DS = "2024-05-01"
TOOL_CALLS = '[{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]'


@pytest.fixture
def isolated(
    trino_server: TrinoServer, request: pytest.FixtureRequest
) -> Iterator[tuple[Warehouse, TrinoReader]]:
    """The warehouse's tables in a namespace of this test's own, Trino on that schema."""
    name = "t_" + request.node.name.lower().replace("[", "_").replace("]", "").replace("-", "_")
    warehouse, config = trino_server.isolated(name[:60])
    with TrinoReader(config) as reader:
        yield warehouse, reader


def _polars(warehouse: Warehouse, table: str) -> pl.DataFrame:
    """The table as polars reads it straight from the catalog (`pl.scan_iceberg`)."""
    iceberg = open_catalog(warehouse.spec).load_table(warehouse.identifier(table))
    return pl.scan_iceberg(iceberg).collect()


@pytest.mark.slow
def test_trino_polars_and_pyiceberg_read_the_same_rows(
    isolated: tuple[Warehouse, TrinoReader],
) -> None:
    warehouse, reader = isolated
    variants = amplified(4)
    answers = distilled(variants)
    answers[0] = answers[0].model_copy(update={"tool_calls": TOOL_CALLS})
    warehouse.write_partition("seeds", DS, "demo", seeds(3))
    warehouse.write_partition("amplified", DS, "demo", variants)
    warehouse.write_partition("distilled", DS, "demo", answers)
    warehouse.write_partition("quarantine", DS, "demo", quarantined(2))

    for table in ("seeds", "amplified", "distilled", "quarantine"):
        assert reader.count(table) == warehouse.count(table) == len(_polars(warehouse, table)) > 0
        assert reader.count(table, ds=DS, source="demo") == reader.count(table)
    ((role, content),) = reader.query(
        f"SELECT messages[1].role, messages[1].content FROM {reader.table_ref('seeds')} "
        "WHERE input_id = 'seed-1'"
    )
    assert (role, content) == ("user", "Question 1?")
    rows = reader.query(
        "SELECT request_id, logprobs[1].top[2].token, logprobs[1].top[2].logprob, tool_calls, "
        f"structured, created_at FROM {reader.table_ref('distilled')} ORDER BY 1"
    )
    frame = _polars(warehouse, "distilled").sort("request_id")
    pyiceberg = warehouse.read_table("distilled").sort("request_id")
    assert [row[0] for row in rows] == frame["request_id"].to_list()
    assert rows[0][1:3] == ("Lyon", -2.5)
    assert frame["logprobs"][0][0]["top"][1] == {"token": "Lyon", "logprob": -2.5, "id": None}
    assert (
        [row[3] for row in rows] == frame["tool_calls"].to_list() == [TOOL_CALLS, None, None, None]
    )
    assert pyiceberg["tool_calls"].to_list() == frame["tool_calls"].to_list()
    assert {row[4] for row in rows} == {None} == set(frame["structured"].to_list())
    created_at: datetime = rows[0][5]
    # Microseconds survive in every reader; the zone as each one shows it.
    assert created_at.replace(tzinfo=None) == CREATED_AT.replace(tzinfo=None)
    assert frame["created_at"][0].replace(tzinfo=None) == CREATED_AT.replace(tzinfo=None)
    assert pyiceberg["created_at"][0].replace(tzinfo=None) == CREATED_AT.replace(tzinfo=None)
    ((request_id,),) = reader.query(
        f"SELECT request_id FROM {reader.table_ref('quarantine')} WHERE line = 1"
    )
    assert request_id is None


@pytest.mark.slow
def test_distilled_joins_amplified(isolated: tuple[Warehouse, TrinoReader]) -> None:
    warehouse, reader = isolated
    variants = amplified(3)
    answers = distilled(variants)
    warehouse.write_partition("amplified", DS, "demo", variants)
    warehouse.write_partition("distilled", DS, "demo", answers)
    rows = reader.query(
        f"SELECT d.request_id, a.request_id, a.prompt FROM {reader.table_ref('distilled')} d "
        f"JOIN {reader.table_ref('amplified')} a "
        "ON d.input_id = a.request_id AND d.ds = a.ds AND d.source = a.source "
        "WHERE d.ds = ? ORDER BY 1",
        [DS],
    )
    assert rows == [
        (answer.request_id, variant.request_id, variant.prompt)
        for answer, variant in zip(answers, variants, strict=True)
    ]


@pytest.mark.slow
def test_a_query_loop_during_replaces_sees_the_old_or_the_new_partition_never_a_mix(
    isolated: tuple[Warehouse, TrinoReader], trino_server: TrinoServer
) -> None:
    warehouse, reader = isolated
    versions = {"old": amplified(3, prefix="old"), "new": amplified(5, prefix="new")}
    warehouse.write_partition("amplified", DS, "other", amplified(2, prefix="other"))
    warehouse.write_partition("amplified", DS, "demo", versions["old"])
    sql = (
        "SELECT count(*), count_if(request_id LIKE 'new-%'), count_if(request_id LIKE 'other-%') "
        f"FROM {reader.table_ref('amplified')}"
    )
    seen: list[tuple[object, ...]] = []
    done = threading.Event()

    def watch() -> None:
        with TrinoReader(reader.config) as watcher:
            while not done.is_set():
                seen.extend(watcher.query(sql))

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    # At least 12 replaces, new and old in turn, ending on old, and until the loop has run
    # at least 6 queries across them (however slowly Trino answers on a loaded machine).
    replaces, give_up = 0, time.monotonic() + 300
    try:
        while replaces < 12 or len(seen) < 6 or replaces % 2:
            assert time.monotonic() < give_up, f"{replaces} replaces, {len(seen)} queries"
            version = versions["new" if replaces % 2 == 0 else "old"]
            warehouse.write_partition("amplified", DS, "demo", version)
            replaces += 1
            time.sleep(0.2)
    finally:
        done.set()
        thread.join(60)
    # Each query sees one snapshot: the untouched partition plus the old 3 or the new 5 rows.
    assert set(seen) <= {(5, 0, 2), (7, 5, 2)}, set(seen)
    assert reader.query(sql) == [(5, 0, 2)]  # the last replace wrote the old version back


@pytest.mark.slow
def test_for_version_as_of_reads_an_older_snapshot(
    isolated: tuple[Warehouse, TrinoReader],
) -> None:
    warehouse, reader = isolated
    first = warehouse.write_partition("amplified", DS, "demo", amplified(3))
    second = warehouse.write_partition("amplified", DS, "demo", amplified(5, prefix="v2"))
    table = reader.table_ref("amplified")
    assert reader.count("amplified") == 5
    ((then,),) = reader.query(f"SELECT count(*) FROM {table} FOR VERSION AS OF {first.snapshot_id}")
    assert then == 3
    snapshots = reader.query(
        f'SELECT snapshot_id FROM "{reader.catalog}"."{reader.schema}"."amplified$snapshots"'
    )
    assert {first.snapshot_id, second.snapshot_id} <= {row[0] for row in snapshots}


@pytest.mark.slow
def test_an_emptied_partition_reads_empty(isolated: tuple[Warehouse, TrinoReader]) -> None:
    warehouse, reader = isolated
    warehouse.write_partition("quarantine", DS, "demo", quarantined(2))
    assert reader.count("quarantine", ds=DS, source="demo") == 2
    warehouse.write_partition("quarantine", DS, "demo", [])
    assert reader.count("quarantine", ds=DS, source="demo") == 0


@pytest.mark.slow
def test_trino_cannot_write_the_tables(isolated: tuple[Warehouse, TrinoReader]) -> None:
    """Writes go through the warehouse, under the partition leases Trino knows nothing of."""
    warehouse, reader = isolated
    warehouse.write_partition("seeds", DS, "demo", seeds(1))
    with pytest.raises(StorageError, match=r"(?i)access denied"):
        reader.query(f"DELETE FROM {reader.table_ref('seeds')}")
    assert reader.count("seeds") == warehouse.count("seeds") == 1


@pytest.mark.parametrize("field", ["schema_name", "catalog"])
@pytest.mark.parametrize(
    "bad",
    ['kimi"batch', "kimi_batch; DROP SCHEMA iceberg.x", "kimi batch", "Kimi", "1abc", "", "x'y"],
)
def test_bad_identifiers_are_rejected_before_sql(field: str, bad: str) -> None:
    # A dead port: had any SQL been sent, this would be a TrinoUnavailableError instead.
    config = TrinoConfig.model_validate({"host": "127.0.0.1", "port": free_port(), field: bad})
    with pytest.raises(InvalidIdentifierError, match="invalid"):
        TrinoReader(config)


@pytest.mark.parametrize("table", ['amplified"', "amplified; DROP TABLE x", "amplified x", "AMP"])
def test_bad_table_names_are_rejected_before_sql(table: str) -> None:
    reader = TrinoReader(TrinoConfig(host="127.0.0.1", port=free_port()))
    with pytest.raises(InvalidIdentifierError):
        reader.count(table)


def test_bad_partition_values_are_rejected_before_sql() -> None:
    reader = TrinoReader(TrinoConfig(host="127.0.0.1", port=free_port()))
    with pytest.raises(InvalidPartitionError):
        reader.count("amplified", ds="2024-05-01'; --")
    with pytest.raises(InvalidPartitionError):
        reader.count("amplified", source="x' OR '1'='1")


def test_an_unreachable_trino_is_a_storage_error() -> None:
    reader = TrinoReader(TrinoConfig(host="127.0.0.1", port=free_port(), max_attempts=1))
    with pytest.raises(TrinoUnavailableError, match="unreachable") as caught:
        reader.count("amplified")
    assert isinstance(caught.value, StorageError)


def _answer(handler: http.server.BaseHTTPRequestHandler, body: dict[str, object]) -> None:
    """A coordinator's 200 with `body`, as a statement's JSON."""
    payload = json.dumps(body).encode()
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(payload)))
    handler.end_headers()
    handler.wfile.write(payload)


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
        _answer(self, body)

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
            TrinoReader(config) as reader,
            pytest.raises(TrinoTimeoutError, match=r"within 2 s \(last state QUEUED\)"),
        ):
            reader.query("SELECT 1")
        polls_at_cancel = QueuedForever.polls
        time.sleep(1.0)
    finally:
        server.shutdown()
    assert QueuedForever.cancels == 1
    assert QueuedForever.polls <= polls_at_cancel + 1  # the client stopped polling
    assert isinstance(TrinoTimeoutError("x"), StorageError)  # the morning report names it


class RefusesForWantOfNodes(http.server.BaseHTTPRequestHandler):
    """A coordinator that fails the first `refusals` statements as Trino does while it counts no
    node up (NO_NODES_AVAILABLE), or with another `error_name`, then answers one row (a real
    Trino refuses so only in a moment it cannot be held in)."""

    refusals = 0
    error_name = "NO_NODES_AVAILABLE"
    statements = 0

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        cls = type(self)
        cls.statements += 1
        body: dict[str, object] = {"id": f"q{cls.statements}", "infoUri": "http://x/ui"}
        if cls.statements <= cls.refusals:
            body["stats"] = {"state": "FAILED"}
            body["error"] = {
                "message": "No nodes available to run query",
                "errorCode": 65542,
                "errorName": cls.error_name,
                "errorType": "INTERNAL_ERROR",
            }
        else:
            body["stats"] = {"state": "FINISHED"}
            body["columns"] = [
                {"name": "n", "type": "bigint", "typeSignature": {"rawType": "bigint"}}
            ]
            body["data"] = [[7]]
        _answer(self, body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def refusing_coordinator(monkeypatch: pytest.MonkeyPatch) -> Iterator[TrinoConfig]:
    monkeypatch.setattr(trino_module, "NO_NODES_RETRY_S", 0.05)
    monkeypatch.setattr(trino_module, "NO_NODES_WAIT_S", 1.0)
    RefusesForWantOfNodes.statements = 0
    RefusesForWantOfNodes.error_name = "NO_NODES_AVAILABLE"
    port = free_port()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), RefusesForWantOfNodes)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield TrinoConfig(host="127.0.0.1", port=port)
    finally:
        server.shutdown()


def test_a_statement_refused_for_want_of_nodes_is_sent_again(
    refusing_coordinator: TrinoConfig,
) -> None:
    RefusesForWantOfNodes.refusals = 2
    with TrinoReader(refusing_coordinator) as reader:
        assert reader.query("SELECT count(*) FROM t") == [(7,)]
    assert RefusesForWantOfNodes.statements == 3


def test_a_coordinator_that_never_counts_a_node_is_a_query_error_after_the_wait(
    refusing_coordinator: TrinoConfig,
) -> None:
    RefusesForWantOfNodes.refusals = 1_000
    started = time.monotonic()
    with (
        TrinoReader(refusing_coordinator) as reader,
        pytest.raises(TrinoQueryError, match="NO_NODES_AVAILABLE"),
    ):
        reader.query("SELECT count(*) FROM t")
    # It gave up after the test's 1 s wait, not the default 30 s (loose: the tier runs niced).
    assert 1.0 <= time.monotonic() - started < 20.0
    assert RefusesForWantOfNodes.statements > 3


def test_another_query_error_is_not_sent_again(refusing_coordinator: TrinoConfig) -> None:
    RefusesForWantOfNodes.refusals = 1
    RefusesForWantOfNodes.error_name = "GENERIC_INTERNAL_ERROR"
    with (
        TrinoReader(refusing_coordinator) as reader,
        pytest.raises(TrinoQueryError, match="GENERIC_INTERNAL_ERROR"),
    ):
        reader.query("SELECT count(*) FROM t")
    assert RefusesForWantOfNodes.statements == 1


@pytest.mark.slow
def test_a_real_statement_past_its_deadline_is_cancelled(
    trino_server: TrinoServer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # Seconds of work for the coordinator: well past a 1 s deadline.
    slow = (
        "SELECT count(*) FROM UNNEST(sequence(1, 10000)) AS a(x) "
        "CROSS JOIN UNNEST(sequence(1, 10000)) AS b(y) WHERE (x * y) % 7 = 3"
    )
    with (
        TrinoReader(trino_server.config(statement_timeout_s=1.0)) as reader,
        pytest.raises(TrinoTimeoutError, match="within 1 s"),
    ):
        reader.query(slow)
    states: list[tuple[object, ...]] = []
    with TrinoReader(trino_server.config()) as watcher:
        for _ in range(60):  # the coordinator records the cancel within moments
            states = watcher.query(
                "SELECT state, error_code FROM system.runtime.queries WHERE query = ?", [slow]
            )
            if states and states[0][0] in ("FAILED", "FINISHED"):
                break
            time.sleep(0.5)
    assert states == [("FAILED", "USER_CANCELED")]
