"""What `seeds_consumed` says of a partition after runs stopped between the two writes of its
input's landing (`land_input`: seeds, then input quarantine; the crash points of
`kimi_batch.crash_points`), over the real landing manifest, warehouse and lease."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest

from kimi_batch.crash_points import CRASH_AT_VARIABLE, CrashPointReached, armed
from kimi_batch.engine import Ledger
from kimi_batch.inputs import Landing
from kimi_batch.pipeline import INPUT_STAGE, HeldPartition
from kimi_batch.settings import Settings
from kimi_batch.warehouse import Warehouse, open_warehouse
from kimi_batch_tests.support.crash_night import DS, SOURCE, land_partition_seeds

GOOD = json.dumps({"id": "g", "prompt": "Name a colour."})
V = [GOOD, "{v broken"]  # its rejected line: 2
W = [GOOD, "{w broken", "{w broken too"]  # its rejected lines: 2, 3


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path))
    for name in ("KIMI_BATCH_DATABASE_URL", "KIMI_BATCH_TRINO_HOST", CRASH_AT_VARIABLE):
        monkeypatch.delenv(name, raising=False)
    return Settings.from_env()


@pytest.fixture
def held(settings: Settings) -> Iterator[HeldPartition]:
    with (
        Ledger(settings.paths.ledger_state) as ledger,
        ledger.lease(f"{DS}|{SOURCE}", "run-1") as lease,
    ):
        yield HeldPartition(ledger=ledger, lease=lease)


def _inbox(settings: Settings, lines: list[str]) -> None:
    """The partition's inbox file rewritten with `lines`, settled (written a minute ago)."""
    path = settings.paths.inbox_dir / DS / f"{SOURCE}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    past = time.time() - 60
    os.utime(path, (past, past))


def _stopped_at(point: str, settings: Settings, store: Warehouse, held: HeldPartition) -> None:
    with armed(point), pytest.raises(CrashPointReached):
        land_partition_seeds(settings, held, store)


def test_seeds_back_at_the_consumed_content_after_two_stopped_runs_are_landed_again(
    settings: Settings, held: HeldPartition
) -> None:
    store = open_warehouse(settings)
    _inbox(settings, V)
    assert land_partition_seeds(settings, held, store)  # V landed whole, recorded consumed
    _inbox(settings, W)
    _stopped_at("quarantine.rows_replaced", settings, store, held)  # W's rejects written
    _inbox(settings, V)
    _stopped_at("seeds.rows_written", settings, store, held)  # V's seeds, W's rejects kept

    # The record of V's first landing must not vouch for the quarantine W's run left.
    assert land_partition_seeds(settings, held, store)

    with Landing(settings.paths) as landing:
        current = landing.current(DS, SOURCE)
        assert current is not None
        assert landing.consumed(DS, SOURCE) == current.sha256
    aside = store.read_partition("quarantine", DS, SOURCE).filter(pl.col("stage") == INPUT_STAGE)
    assert aside["line"].to_list() == [2]  # V's rejected line; W's are gone
    assert aside["input_sha256"].to_list() == [current.sha256]
    assert store.read_partition("seeds", DS, SOURCE)["input_sha256"].to_list() == [current.sha256]
    assert not land_partition_seeds(settings, held, store)  # consumed now: kept
