"""`kimi-batch state migrate`: a box's SQLite state copied into a real PostgreSQL, whole and once."""

from __future__ import annotations

import io
import json
import sqlite3
from contextlib import closing
from datetime import date
from pathlib import Path

import dagster as dg
import psycopg
import pytest

from kimi_batch.batch_api import ApiStore
from kimi_batch.cli.commands import main
from kimi_batch.cli.state import migrate_state
from kimi_batch.definitions import batch_assets, build_resources
from kimi_batch.defs.partitions import SOURCE_PARTITIONS_NAME
from kimi_batch.engine import Ledger
from kimi_batch.inputs import Landing
from kimi_batch.paths import StatePaths
from kimi_batch.settings import Settings
from kimi_batch.state import connect_state
from kimi_batch.warehouse import open_warehouse
from kimi_batch_tests.support.batches import chat_line, jsonl, landed_batch
from kimi_batch_tests.support.engine import server_tasks
from kimi_batch_tests.support.llama_server import LlamaEnv
from kimi_batch_tests.support.postgres import PostgresServer
from kimi_batch_tests.support.results import make_result
from kimi_batch_tests.support.rows import quarantined

DAY = date(2026, 11, 28)
START = date(2025, 1, 1)


@pytest.fixture
def box(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """A box's SQLite state: finished requests, two landed versions of an input, a batch, and
    a table partition (its Iceberg catalog is in the ledger's file)."""
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("KIMI_BATCH_DATABASE_URL", raising=False)
    settings = Settings.from_env()
    with Ledger(settings.paths.ledger_state) as ledger:
        for i in range(3):
            ledger.put(make_result(f"answer {i}", request_id=f"r{i}", input_id=f"s{i}", tag="seed"))
        with ledger.lease("2026-11-28|web", "a-run"):  # held while migrating: left behind
            pass
    inbox = settings.paths.inbox_dir
    inbox.mkdir(parents=True)
    with Landing(settings.paths) as landing:
        for text in ('{"prompt": "one"}\n', '{"prompt": "two"}\n'):
            (inbox / "web.jsonl").write_text(text)
            assignment = landing.assign(inbox.joinpath("web.jsonl").name, arrived=DAY, start=START)
            landing.land(inbox / "web.jsonl", assignment, max_bytes=1 << 20, settle_s=0.0)
    landed_batch(settings, jsonl(chat_line("a"), chat_line("b")))
    open_warehouse(settings).write_partition("quarantine", DAY, "web", quarantined(2))
    return settings


def test_a_migrated_box_finds_every_row_partition_and_batch_in_postgres(
    box: Settings, postgres_server: PostgresServer, tmp_path: Path
) -> None:
    url = postgres_server.new_database()
    copies = {copy.store: copy for copy in migrate_state(box, url)}

    assert copies["ledger"].rows == {
        "results": 3,
        "iceberg_tables": 1,
        "iceberg_namespace_properties": 1,
    }
    # Two versions of the inbox file, and the batch's input (a partition of its own); no seeds
    # were landed from them (`consumed`).
    assert copies["manifest"].rows == {"files": 1, "versions": 3, "consumed": 0, "fingerprints": 0}
    assert copies["api"].rows["batches"] == 1
    # The files the rows name went along: another host, with nothing of the box's, reads them.
    assert (copies["manifest"].files, copies["api"].files) == (3, 1)
    assert copies["manifest"].missing_files == copies["api"].missing_files == []
    elsewhere = StatePaths(home=tmp_path / "another-host", database_url=url)
    with ApiStore(box.paths) as old:
        (batch,) = old.batches()
    with Landing(elsewhere) as landing, Landing(box.paths) as before:
        for ds, source in ((DAY.isoformat(), "web"), (batch.ds, batch.source)):
            assert ds is not None
            assert source is not None
            there = landing.readable(landing.current(ds, source))
            here = before.current(ds, source)
            assert there is not None
            assert here is not None
            assert there.path.read_bytes() == here.path.read_bytes()
    with ApiStore(elsewhere) as store:
        (upload,) = store.files()
        assert store.blob_path(upload).read_bytes() == jsonl(chat_line("a"), chat_line("b"))
    moved = box.model_copy(update={"database_url": url})
    with Ledger(moved.paths.ledger_state) as ledger:
        assert ledger.finished_keys(["r0", "r1", "r2", "r3"]) == {"r0", "r1", "r2"}
        assert ledger.get_many(["r1"])["r1"].text == "answer 1"
        with ledger.lease("2026-11-28|web", "next-run") as lease:  # no lease came along
            lease.check()
    with Landing(moved.paths) as landing, Landing(box.paths) as before:
        assert landing.assignment("web.jsonl") == before.assignment("web.jsonl")
        assert landing.current(DAY.isoformat(), "web") == before.current(DAY.isoformat(), "web")
        # The ids go on after the copied ones: a version landed now is the newest.
        inbox = moved.paths.inbox_dir
        (inbox / "web.jsonl").write_text('{"prompt": "three"}\n')
        assignment = landing.assignment("web.jsonl")
        assert assignment is not None
        newest = landing.land(inbox / "web.jsonl", assignment, max_bytes=1 << 20, settle_s=0.0)
        assert landing.current(DAY.isoformat(), "web") == newest
    # The tables' catalog came along: the same snapshot, the same rows, read through PostgreSQL.
    tables, there = open_warehouse(box), open_warehouse(moved)
    assert there.spec.sqlite_path is None
    assert there.snapshot_id("quarantine") == tables.snapshot_id("quarantine") is not None
    assert there.read_partition("quarantine", DAY, "web").equals(
        tables.read_partition("quarantine", DAY, "web")
    )
    with ApiStore(moved.paths) as store, ApiStore(box.paths) as old:
        assert store.batches() == old.batches()
        assert store.files() == old.files()


def test_a_second_migration_copies_nothing_twice(
    box: Settings, postgres_server: PostgresServer, capsys: pytest.CaptureFixture[str]
) -> None:
    url = postgres_server.new_database()
    migrate_state(box, url)
    with Ledger(box.paths.ledger_state) as ledger:  # the box went on after the first copy
        ledger.put(make_result("late", request_id="r9", input_id="s9", tag="seed"))

    assert main(["state", "migrate", "--to", url]) == 0

    report = json.loads(capsys.readouterr().out)
    assert all("already holds rows" in store["skipped"] for store in report["stores"])
    assert [store["files"] for store in report["stores"]] == [0, 0, 0]  # each shared once
    moved = box.model_copy(update={"database_url": url})
    with Ledger(moved.paths.ledger_state) as ledger:
        assert ledger.count() == 3


def test_an_id_sqlite_gave_a_deleted_row_is_not_given_again_after_migrating(
    box: Settings, postgres_server: PostgresServer
) -> None:
    """Found by review: the target's counters restarted at the largest id copied, so the id of
    a newest row deleted before the copy was given again (SQLite's AUTOINCREMENT never does)."""
    with closing(sqlite3.connect(box.paths.manifest_path)) as manifest, manifest:
        (newest,) = manifest.execute("SELECT max(id) FROM versions").fetchone()
        manifest.execute("DELETE FROM versions WHERE id = ?", (newest,))
    url = postgres_server.new_database()

    migrate_state(box, url)

    moved = box.model_copy(update={"database_url": url})
    with connect_state(moved.paths.manifest_state) as manifest:
        manifest.execute(
            "INSERT INTO versions (ds, source, name, sha256, ext, size, landed_at) "
            "VALUES ('2026-11-29', 'web', 'web.jsonl', 'ab', '.jsonl', 1, 0)"
        )
        (given,) = manifest.execute("SELECT max(id) FROM versions").fetchone()
    assert given == newest + 1


def test_migrating_to_something_not_postgres_is_one_line(
    box: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["state", "migrate", "--to", "mysql://db/x"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("kimi-batch: error: state migrate --to mysql://db/x: must be a")
    assert error.count("\n") == 1
    assert not Path(box.paths.ledger_path).with_name("ledger.sqlite3-journal").exists()


# ---- the password: never on argv, never shown -----------------------------------------------

PASSWORD = "Tr0ub4dor-3"


def _with_password(url: str, *, in_query: bool = False) -> str:
    """The test cluster's URL carrying a password (its `trust` authentication ignores it)."""
    if in_query:
        return f"{url}?password={PASSWORD}"
    scheme, rest = url.split("://", 1)
    user, _, host = rest.partition("@")
    return f"{scheme}://{user}:{PASSWORD}@{host}"


def _ledger_rows(box: Settings, url: str) -> int:
    with Ledger(box.model_copy(update={"database_url": url}).paths.ledger_state) as ledger:
        return ledger.count()


def test_migrate_reads_the_url_from_the_environment_and_shows_it_masked(
    box: Settings,
    postgres_server: PostgresServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = _with_password(postgres_server.new_database())
    monkeypatch.setenv("KIMI_BATCH_DATABASE_URL", url)  # what every machine sets afterwards

    assert main(["state", "migrate"]) == 0

    out, err = capsys.readouterr()
    assert PASSWORD not in out + err
    assert json.loads(out)["to"] == url.replace(PASSWORD, "***")
    assert _ledger_rows(box, url) == 3


@pytest.mark.parametrize("source", ["--to-env", "--to-file", "stdin"])
def test_migrate_reads_the_url_from_a_variable_a_file_or_stdin(
    source: str,
    box: Settings,
    postgres_server: PostgresServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    url = _with_password(postgres_server.new_database(), in_query=True)
    if source == "--to-env":
        monkeypatch.setenv("TEAM_DB", url)
        argv = ["--to-env", "TEAM_DB"]
    elif source == "--to-file":
        (tmp_path / "db-url").write_text(url + "\n")
        argv = ["--to-file", str(tmp_path / "db-url")]
    else:
        monkeypatch.setattr("sys.stdin", io.StringIO(url + "\n"))
        argv = ["--to-file", "-"]

    assert main(["state", "migrate", *argv]) == 0

    out, err = capsys.readouterr()
    assert PASSWORD not in out + err
    assert json.loads(out)["to"].endswith("?password=***")
    assert _ledger_rows(box, url) == 3


def test_a_password_on_the_command_line_is_refused_before_anything_connects(
    box: Settings, postgres_server: PostgresServer, capsys: pytest.CaptureFixture[str]
) -> None:
    bare = postgres_server.new_database()
    for url in (_with_password(bare), _with_password(bare, in_query=True)):
        assert main(["state", "migrate", "--to", url]) == 2

        error = capsys.readouterr().err
        assert error.startswith("kimi-batch: error: state migrate --to postgresql://")
        assert "visible to every user of this machine" in error
        assert error.count("\n") == 1
        assert PASSWORD not in error
    with psycopg.connect(bare) as db:  # nothing was copied
        (schemas,) = db.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'kimi_%'"
        ).fetchone() or (None,)
    assert schemas == 0


def test_migrate_without_a_target_is_one_line(
    box: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("TEAM_DB", raising=False)
    for argv in ([], ["--to-env", "TEAM_DB"]):
        assert main(["state", "migrate", *argv]) == 2
        error = capsys.readouterr().err
        assert error.startswith("kimi-batch: error: state migrate")
        assert error.count("\n") == 1


def test_a_url_libpq_cannot_parse_fails_in_one_line_without_its_password(
    box: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KIMI_BATCH_DATABASE_URL", f"postgresql://kimi:{PASSWORD}%zz@127.0.0.1:1/kb")

    assert main(["state", "migrate"]) == 2

    error = capsys.readouterr().err
    assert "invalid percent-encoded token" in error
    assert PASSWORD not in error
    assert error.count("\n") == 1


# ---- a real run moved: the rerun on PostgreSQL sends nothing -----------------------------------

SMALL_RUN = {
    "ops": {
        "amplified_prompts": {"config": {"strategies": ["paraphrase"], "max_tokens": 16}},
        "distilled_responses": {"config": {"max_tokens": 16}},
    }
}


def _materialize(
    instance: dg.DagsterInstance, key: dg.MultiPartitionKey
) -> dg.ExecuteInProcessResult:
    settings = Settings.from_env()
    return dg.materialize(
        batch_assets(settings),
        partition_key=key,
        resources=build_resources(settings),
        instance=instance,
        run_config=SMALL_RUN,
    )


@pytest.mark.slow
def test_a_run_migrated_to_postgres_is_not_generated_again(
    llama_env: LlamaEnv,
    postgres_server: PostgresServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inbox = llama_env.home / "inbox"
    inbox.mkdir(parents=True, exist_ok=True)
    rows = [json.dumps({"id": f"m{i}", "prompt": f"Name a colour, number {i}."}) for i in range(3)]
    (inbox / "moved.jsonl").write_text("".join(row + "\n" for row in rows))
    key = dg.MultiPartitionKey({"date": Settings.from_env().today().isoformat(), "source": "moved"})
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(SOURCE_PARTITIONS_NAME, ["moved"])
        assert _materialize(instance, key).success  # on the box: SQLite
        url = postgres_server.new_database()
        migrate_state(Settings.from_env(), url)
        monkeypatch.setenv("KIMI_BATCH_DATABASE_URL", url)
        before = server_tasks(llama_env.server)
        again = _materialize(instance, key)  # on PostgreSQL
        sent = server_tasks(llama_env.server) - before
    assert again.success
    for asset in ("amplified_prompts", "distilled_responses"):
        (done,) = again.asset_materializations_for_node(asset)
        assert done.metadata["generated"].value == 0
        assert done.metadata["from_ledger"].value == done.metadata["requests"].value
    assert sent == 0


def test_a_box_with_nul_in_its_rows_migrates_whole(
    box: Settings, postgres_server: PostgresServer, tmp_path: Path
) -> None:
    """Older code let U+0000 into an input id; answers may hold it. PostgreSQL text cannot: the
    copy still goes through (the id as its escape, the answer exactly) and the files follow."""
    with Ledger(box.paths.ledger_state) as ledger:
        ledger.put(make_result("an\x00swer", request_id="r-nul", input_id="in\x00put", tag="seed"))
    url = postgres_server.new_database()

    copies = {copy.store: copy for copy in migrate_state(box, url)}

    assert copies["ledger"].rows["results"] == 4
    assert copies["manifest"].files == 3
    moved = box.model_copy(update={"database_url": url})
    with Ledger(moved.paths.ledger_state) as ledger:
        found = ledger.get_many(["r-nul"])["r-nul"]
        assert (found.text, found.input_id) == ("an\x00swer", "in\x00put")
    assert Ledger.count_by_tag(moved.paths.ledger_state) == {"seed": 4}


def test_a_table_the_target_has_no_place_for_is_refused_not_left_behind(
    box: Settings, postgres_server: PostgresServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by review: a ledger still holding an object-store warehouse's version pointers
    (`warehouse_partitions`, an older version's) migrated with them silently dropped (rc 0),
    and `warehouse migrate` then found nothing to copy."""
    with closing(sqlite3.connect(box.paths.ledger_path)) as ledger, ledger:
        ledger.execute(
            "CREATE TABLE warehouse_partitions (table_name TEXT, ds TEXT, source TEXT, "
            "version TEXT, PRIMARY KEY (table_name, ds, source))"
        )
        ledger.execute(
            "INSERT INTO warehouse_partitions VALUES ('seeds', '2024-05-01', 'demo', 'v7')"
        )
    url = postgres_server.new_database()
    assert main(["state", "migrate", "--to", url]) == 2
    error = capsys.readouterr().err
    assert "table warehouse_partitions (1 rows) has no place in the target" in error
    assert "kimi-batch warehouse migrate" in error
    moved = box.model_copy(update={"database_url": url})
    with Ledger(moved.paths.ledger_state) as ledger:
        assert ledger.count() == 0  # refused before anything was copied
