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


def test_a_file_over_the_limit_is_read_once_the_limit_is_raised(inbox: Path) -> None:
    # Its quarantine row says "split it or raise the limit": raising it must be enough.
    path = put(inbox / DAY / "big.jsonl", '{"prompt": "a long question"}\n')
    size = path.stat().st_size

    def tick(cursor: InboxCursor, limit: int) -> tuple[list[str], InboxCursor]:
        planned = plan_inbox_tick(
            scan_inbox(inbox),
            cursor,
            assign=_assign(inbox),
            is_valid_ds=lambda ds: True,
            max_input_bytes=limit,
        )
        return [request.run_key for request in planned.requests], planned.cursor

    refused, cursor = tick(InboxCursor(), size - 1)
    again, cursor = tick(cursor, size - 1)
    raised, cursor = tick(cursor, size)
    after, _ = tick(cursor, size)

    assert [key.split(":")[1] for key in refused] == ["unread"]
    assert again == []  # still over the limit: its quarantine run is not asked for twice
    assert raised == [f"{DAY}/big.jsonl:{file_sha256(path)[:16]}"]
    assert after == []
