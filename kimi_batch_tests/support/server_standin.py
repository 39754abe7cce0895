"""A sleeping process recorded as a state dir's resident llama-server: what `status`, `server
stop` and the bench see of a server that runs, without starting one."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

from kimi_batch.llama import ResidentServer, server_from_settings
from kimi_batch.llama.process import PidRecord, process_start_ticks
from kimi_batch.settings import Settings

__all__ = ["standing_in_for_the_server"]


@contextmanager
def standing_in_for_the_server(settings: Settings) -> Iterator[subprocess.Popen[bytes]]:
    """The process, recorded with the spec `settings` start (the pid record and spec file that
    `kimi-batch server start` leaves); killed on exit."""
    manager = server_from_settings(settings)
    assert isinstance(manager, ResidentServer)
    manager.state_dir.mkdir(parents=True, exist_ok=True)
    manager.spec_path.write_text(manager.spec.model_dump_json())
    stand_in = subprocess.Popen(["sleep", "120"])
    try:
        ticks = process_start_ticks(stand_in.pid)
        assert ticks is not None
        record = PidRecord(pid=stand_in.pid, start_ticks=ticks, started_at=time.time())
        manager.pid_path.write_text(record.model_dump_json())
        yield stand_in
    finally:
        stand_in.kill()
        stand_in.wait()
