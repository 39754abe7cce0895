"""One inbox tick planned over real files: the hash budget and the cursor's format."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from kimi_batch.inputs.inbox import InboxFile, file_sha256, scan_inbox
from kimi_batch.inputs.inbox_tick import InboxCursor, plan_inbox_tick
from kimi_batch.inputs.landing import Assignment, Landing
from kimi_batch.paths import StatePaths
from kimi_batch.settings import Settings
from kimi_batch_tests.support.inbox_files import put

DAY = "2025-06-01"


def _assign(inbox: Path) -> Callable[[InboxFile], Assignment]:
    landing = Landing(StatePaths(home=inbox.parent))
    settings = Settings.from_env()
    return lambda item: landing.assign_file(
        item, arrived=settings.today(), start=settings.first_partition_date()
    )


def test_hash_budget_spreads_work_over_ticks_without_losing_files(inbox: Path) -> None:
    for index in range(5):
        put(inbox / DAY / f"f{index}.jsonl", f'{{"prompt": "{index}"}}\n')
    cursor = InboxCursor()
    requested: list[str] = []

    for _ in range(10):
        tick = plan_inbox_tick(
            scan_inbox(inbox),
            cursor,
            assign=_assign(inbox),
            is_valid_ds=lambda ds: True,
            max_input_bytes=1 << 20,
            hash_budget_s=0.0,
        )
        requested += [request.file.name for request in tick.requests]
        cursor = tick.cursor

    assert requested == [f"{DAY}/f{index}.jsonl" for index in range(5)]  # one a tick, each once


def test_cursor_format_and_corrupt_cursor(inbox: Path) -> None:
    path = put(inbox / DAY / "a.jsonl")
    tick = plan_inbox_tick(
        scan_inbox(inbox),
        InboxCursor(),
        assign=_assign(inbox),
        is_valid_ds=lambda ds: True,
        max_input_bytes=1 << 20,
    )

    stat = path.stat()
    assert InboxCursor.parse(tick.cursor.dump()).root == {
        f"{DAY}/a.jsonl": (stat.st_mtime_ns, stat.st_size, file_sha256(path))
    }
    assert InboxCursor.parse("not json").root == {}
    assert InboxCursor.parse('{"a": "b"}').root == {}
    assert InboxCursor.parse(None).root == {}
