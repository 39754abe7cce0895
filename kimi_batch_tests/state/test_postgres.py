"""The PostgreSQL state database against a real server: what the URL asks of each connection."""

from __future__ import annotations

import pytest

from kimi_batch.state.postgres import PostgresDatabase
from kimi_batch_tests.support.postgres import PostgresServer

pytestmark = [pytest.mark.slow, pytest.mark.no_llama_server]


def test_the_url_s_own_options_hold_beside_the_lock_timeout(
    postgres_server: PostgresServer,
) -> None:
    # The lock timeout was passed as the `options` keyword, which replaced the URL's own.
    url = postgres_server.new_database() + "?options=-c%20statement_timeout%3D4321"
    db = PostgresDatabase(url, "kimi_ledger", timeout_s=7)
    try:
        assert db.execute("SHOW statement_timeout").fetchone() == ("4321ms",)
        assert db.execute("SHOW lock_timeout").fetchone() == ("7s",)
    finally:
        db.close()
