"""A state folder whose name a URL must escape (a space): the tables' files stay in it, and the
real Trino reads them where the catalog says they are."""

from __future__ import annotations

from pathlib import Path

import pytest

from kimi_batch.settings import Settings
from kimi_batch.warehouse import TrinoReader, open_warehouse
from kimi_batch_tests.support.rows import amplified
from kimi_batch_tests.support.trino import TrinoServer, catalog_over

pytestmark = pytest.mark.slow  # the session's Trino (it comes with the llama-server session)


def test_a_state_folder_named_with_a_space_keeps_its_tables_and_trino_reads_them(
    tmp_path: Path, llama_trino: TrinoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by review: the files went to a sibling folder `state%20home` (pyiceberg takes a
    file URL's path as written, so the percent-encoded one named another folder)."""
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path / "state home"))
    for name in ("KIMI_BATCH_WAREHOUSE", "KIMI_BATCH_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    settings = Settings.from_env()

    open_warehouse(settings).write_partition("amplified", "2024-05-01", "demo", amplified(3))

    assert [path.name for path in tmp_path.iterdir()] == ["state home"]
    assert list((tmp_path / "state home" / "warehouse").rglob("*.parquet"))
    with catalog_over(llama_trino, settings) as server, TrinoReader(server.config()) as reader:
        assert reader.count("amplified") == 3
